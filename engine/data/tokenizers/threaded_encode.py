"""Encode a batch of texts on several threads (tiktoken's Rust core releases the GIL while it encodes).

`EncodeHelpers` keeps helper threads for the life of a tokenizer, each with an encoder of its own,
built on that thread: measured on Llama 3 / Alpaca, threads that share one tiktoken `Encoding`, or a
thread started per call, cost ~2x the CPU for the same ids and gain no wall time, while a long-lived
thread with its own `Encoding` (~0.08 s to build) halves the encode wall time on two idle cores.

`encode_chunks` hands out fixed chunks of a batch to the calling thread and to the helpers, first come
first served, until every chunk is handed out; then the calling thread runs `finish` (the Python work
on an encoded chunk: spans, lists) on each chunk in order, encoding itself any chunk a helper still
holds (the first result stored wins; the encoders are equal), so it never waits for a helper that the
OS has descheduled, and a helper that fails costs time, not the result. Each chunk's result is stored at its index, so the output
is the same, in the same order, whatever the scheduling or the number of threads. A helper that is
busy or still building its encoder simply takes no chunk.

After a `fork` the helper threads do not exist in the child: the helpers restart there on first use.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

CHUNK = 32  # texts per chunk: small enough to balance the threads, large enough to amortise the hand-out
MIN_CHARS = 20_000  # below this many characters in a batch, the calling thread encodes it alone
MAX_THREADS = 4  # the calling thread + up to 3 helpers: more would wait for the GIL-bound `finish`


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_threads(threads: int | None) -> int:
    """`threads` as given (>= 1), or, for None, the usable CPUs capped at `MAX_THREADS`.
    Raises ValueError for anything else."""
    if threads is None:
        return max(1, min(usable_cpus(), MAX_THREADS))
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"encode_threads: must be a positive integer or None (automatic), got {threads!r}")
    return threads


def _helper_loop(jobs: queue.SimpleQueue, make_encoder: Callable[[], Any]) -> None:
    try:
        encoder = make_encoder()
    except Exception:  # no encoder: this helper takes no chunk, the calling thread does the work
        encoder = None
    while (job := jobs.get()) is not None:
        if encoder is not None:
            job(encoder)


class EncodeHelpers:
    """Long-lived helper threads (daemons), each with its own encoder from `make_encoder()`, built on
    that thread when it starts.

    Args:
      make_encoder: () -> an encoder for `encode_chunks`' `encode`; must not hold the tokenizer.
      count: number of helper threads (>= 1).
    """

    def __init__(self, make_encoder: Callable[[], Any], count: int):
        self._make, self.count = make_encoder, count
        self._pid: int | None = None
        self._queues: list[queue.SimpleQueue] = []
        self._lock = threading.Lock()

    def post(self, job: Callable[[Any], None]) -> None:
        """Give `job(encoder)` to every helper (starting them in this process first if needed)."""
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child where the threads are gone
                self._pid, self._queues = os.getpid(), []
                for i in range(self.count):
                    jobs: queue.SimpleQueue = queue.SimpleQueue()
                    name = f"tunebench-encode-{i}"
                    threading.Thread(
                        target=_helper_loop, args=(jobs, self._make), name=name, daemon=True
                    ).start()
                    self._queues.append(jobs)
            for jobs in self._queues:
                jobs.put(job)

    def close(self) -> None:
        """Let the helper threads end (they finish the job at hand first)."""
        with self._lock:
            if self._pid == os.getpid():
                for jobs in self._queues:
                    jobs.put(None)
            self._pid, self._queues = None, []


def encode_chunks(
    items: Sequence[Any],
    encode: Callable[[Any, Sequence[Any]], Any],
    finish: Callable[[Sequence[Any], Any], list[Any]],
    *,
    encoder: Any,
    helpers: EncodeHelpers | None,
    weight: int | None = None,
) -> list[Any]:
    """``finish(chunk, encode(encoder, chunk))`` over consecutive chunks of `items`, concatenated in order.

    Args:
      items: the batch (texts).
      encode: (encoder, chunk) -> encoded form; runs on the calling thread with `encoder` or on a helper
        with the helper's own encoder, which must give the same result.
      finish: (chunk, encoded) -> a list of results for the chunk's items; runs on the calling thread.
      encoder: the calling thread's encoder.
      helpers: helper threads, or None to encode on the calling thread alone.
      weight: the batch's size in characters (None: not known); below `MIN_CHARS` no helper is used.
    Returns every chunk's results in `items` order. Raises what `encode` or `finish` raise on the
    calling thread (a helper's error only leaves its chunk to the calling thread).
    """
    n_chunks = -(-len(items) // CHUNK)
    if helpers is None or n_chunks < 2 or (weight is not None and weight < MIN_CHARS):
        return finish(items, encode(encoder, items)) if items else []
    chunks = [items[k * CHUNK : (k + 1) * CHUNK] for k in range(n_chunks)]
    encoded: list[Any] = [None] * n_chunks
    done = [False] * n_chunks
    lock = threading.Lock()
    state = {"next": 0, "stop": False}

    def claim() -> int | None:
        with lock:
            k = state["next"]
            if state["stop"] or k >= n_chunks:
                return None
            state["next"] = k + 1
            return k

    def store(k: int, value: Any) -> None:
        with lock:
            if not done[k]:  # the first result stored wins (both are equal)
                encoded[k], done[k] = value, True

    def helper_job(own_encoder: Any) -> None:
        try:
            while (k := claim()) is not None:
                store(k, encode(own_encoder, chunks[k]))
        except Exception:  # the calling thread encodes what this helper left undone
            pass

    finished: list[list[Any]] = []
    helpers.post(helper_job)
    try:
        # Encode first, finish after: while every thread only encodes, each holds the GIL just
        # between two calls; `finish` on this thread meanwhile would stall the helpers (measured:
        # ~40% of the two-thread gain lost).
        while (k := claim()) is not None:
            store(k, encode(encoder, chunks[k]))
        for k in range(n_chunks):
            if not done[k]:  # a helper still holds it: encode it here too, never wait for a helper
                store(k, encode(encoder, chunks[k]))
            finished.append(finish(chunks[k], encoded[k]))
            encoded[k] = None
    finally:
        with lock:
            state["stop"] = True  # a helper that starts this job late takes nothing
    return [r for part in finished for r in part]
