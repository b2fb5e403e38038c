"""Threaded encoding (`threaded_encode`): the same ids, spans and masks as one thread, in the same
order, every time -- on the real Llama 3 file and Alpaca rows, and with stand-in encoders that force a
helper thread to take chunks, to fail, or to hold a chunk past the end of the call."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from tokenizers import Tokenizer as RustTokenizer

from engine.data import AlpacaInstructTemplate, instruct_dataset
from engine.data.tokenizers import load_tokenizer
from engine.data.tokenizers.threaded_encode import (
    CHUNK,
    MIN_CHARS,
    EncodeHelpers,
    encode_chunks,
    resolve_threads,
)

WAIT_S = 120  # generous: the machine may be loaded


def _alpaca_texts(data_dir, n: int = 400) -> tuple[list[dict], list[str]]:
    """The first `n` Alpaca rows and their prompt + response texts (> 10 chunks, > `MIN_CHARS`)."""
    rows = json.loads((data_dir / "alpaca_data_cleaned_1000.json").read_text())[:n]
    template = AlpacaInstructTemplate()
    return rows, [template.format(r) + r["output"] for r in rows]


def test_threaded_spans_equal_one_thread_and_library(tok_dir, data_dir):
    tok = load_tokenizer(tok_dir / "llama3")
    rows, texts = _alpaca_texts(data_dir)
    texts = texts + ["<|begin_of_text|>x<|eot_id|> ünï 🤗"] * 3  # special-token strings split the text
    assert sum(map(len, texts)) > MIN_CHARS and len(texts) > 10 * CHUNK  # the threaded path is taken
    tok.encode_threads = 1
    one = tok.encode_spans(texts)
    tok.encode_threads = 2
    runs = [tok.encode_spans(texts) for _ in range(3)]
    assert all(run == one for run in runs)  # identical and deterministic
    ref = RustTokenizer.from_file(str(tok_dir / "llama3" / "tokenizer.json"))
    for (ids, starts, ends), want in zip(one, ref.encode_batch(texts, add_special_tokens=False)):
        assert ids == want.ids and list(zip(starts, ends)) == want.offsets


def test_threaded_dataset_equals_one_thread(tok_dir, data_dir):
    tok = load_tokenizer(tok_dir / "llama3")
    rows, _ = _alpaca_texts(data_dir)
    built = []
    for threads in (1, 2, None, 2):
        tok.encode_threads = threads
        ds = instruct_dataset(tok, source=rows, template=AlpacaInstructTemplate(), cache=False)
        built.append((ds._flat.tokens, ds._flat.mask, ds._flat.offsets))
    for tokens, mask, offsets in built[1:]:
        np.testing.assert_array_equal(tokens, built[0][0])
        np.testing.assert_array_equal(mask, built[0][1])
        np.testing.assert_array_equal(offsets, built[0][2])


class _Recorder:
    """Stand-in encoder: "encodes" a text as its characters' code points and records which thread
    did each chunk. The calling thread's first chunk waits until a helper has taken one, so the
    helper's part of the work is certain, not left to the scheduler."""

    def __init__(self, name: str, helper_took: threading.Event):
        self.name, self.helper_took = name, helper_took
        self.chunks: list[str] = []

    def encode(self, chunk: list[str]) -> list[list[int]]:
        if self.name == "helper":
            self.helper_took.set()
        elif not self.chunks:
            assert self.helper_took.wait(WAIT_S), "no helper thread took a chunk"
        self.chunks.append(chunk[0])
        return [[ord(c) for c in text] for text in chunk]


def test_encode_chunks_keeps_order_with_helpers():
    texts = [f"text {i} " * (i % 7 + 1) for i in range(10 * CHUNK + 5)]
    took = threading.Event()
    helper_encoders: list[_Recorder] = []

    def make():
        rec = _Recorder("helper", took)
        helper_encoders.append(rec)
        return rec

    helpers = EncodeHelpers(make, count=1)
    main = _Recorder("main", took)
    want = [(t, [ord(c) for c in t]) for t in texts]
    got = encode_chunks(
        texts,
        lambda enc, chunk: enc.encode(chunk),
        lambda chunk, enc: list(zip(chunk, enc)),
        encoder=main,
        helpers=helpers,
    )
    assert got == want
    assert helper_encoders[0].chunks and main.chunks  # both threads encoded some chunks
    assert len(helper_encoders[0].chunks) + len(main.chunks) == -(-len(texts) // CHUNK)  # each chunk once
    helpers.close()


def test_a_failing_or_late_helper_leaves_its_chunks_to_the_calling_thread():
    """A helper that raises, and one that holds its chunk until the call is over: the same result,
    and the calling thread never waits for either."""
    release = threading.Event()
    took = threading.Event()

    class Broken:
        def encode(self, chunk):
            raise RuntimeError("helper failed")

    class Late:
        def encode(self, chunk):
            took.set()
            release.wait(WAIT_S)  # holds its chunk until the test lets it go
            return [[-1] for _ in chunk]  # a wrong answer that must never be used

    class Main:
        def __init__(self):
            self.calls = 0

        def encode(self, chunk):
            if self.calls == 0:
                assert took.wait(WAIT_S), "the late helper took no chunk"
            self.calls += 1
            return [[len(t)] for t in chunk]

    texts = [str(i) * (i % 5 + 1) for i in range(6 * CHUNK)]
    made = iter([Broken(), Late()])
    helpers = EncodeHelpers(lambda: next(made), count=2)
    main = Main()
    got = encode_chunks(
        texts, lambda enc, chunk: enc.encode(chunk), lambda chunk, e: list(e), encoder=main, helpers=helpers
    )
    release.set()
    assert got == [[len(t)] for t in texts]
    assert main.calls == 6  # every chunk: the broken helper's and the late one's too
    helpers.close()


def test_encode_threads_setting():
    assert resolve_threads(3) == 3
    assert 1 <= resolve_threads(None) <= 4
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="encode_threads"):
            resolve_threads(bad)
