"""Tokenized datasets: rows -> messages -> ids + loss mask, stored flat in numpy, served as samples.

A sample is ``{"tokens": list[int], "labels": list[int], "source_id": int}`` with labels already
shifted (``labels[i]`` is the target at position i: ``tokens[i+1]`` or -100). A preference sample
holds ``chosen_tokens``, ``chosen_labels``, ``rejected_tokens``, ``rejected_labels`` and ``source_id``.

Every dataset has `source_names` (list of names; a sample's `source_id` indexes it), `pad_id`, and
for the single-source datasets here `skipped` (rows dropped by `skip_bad_rows`) and `filtered`
(rows dropped by `filter_fn` or, for plain text, blank rows).

Length: about 550 lines: the one tokenization pass (rows -> ids + masks, batched) and the flat
numpy storage it writes belong together; formats and templates live in their own modules.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from engine.data import cache as data_cache
from engine.data.data_errors import DataError, where
from engine.data.messages import RowError, apply_column_map
from engine.data.sources import load_rows, source_fingerprint
from engine.data.tokenize import IGNORE_INDEX, shifted_labels, tokenize_messages, tokenize_messages_batch

log = logging.getLogger("engine.data")


@dataclass
class _Flat:
    """Ragged int sequences with masks, stored as one flat array each plus offsets."""

    tokens: np.ndarray  # [N_total] int32
    mask: np.ndarray  # [N_total] bool, True = excluded from the loss
    offsets: np.ndarray  # [num_samples + 1] int64

    @classmethod
    def build(cls, seqs: list[tuple[list[int], list[bool]]]) -> _Flat:
        lengths = np.array([len(ids) for ids, _ in seqs], dtype=np.int64)
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        n = int(offsets[-1])
        tokens = np.fromiter(chain.from_iterable(ids for ids, _ in seqs), dtype=np.int32, count=n)
        mask = np.fromiter(chain.from_iterable(ms for _, ms in seqs), dtype=bool, count=n)
        return cls(tokens, mask, offsets)

    def get(self, i: int) -> tuple[list[int], list[bool]]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[a:b].tolist(), self.mask[a:b].tolist()

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1


@dataclass
class _Report:
    rows: int = 0
    skipped: int = 0
    filtered: int = 0
    first_problem: str = ""
    extra: dict = field(default_factory=dict)


def _check_template_fields(template, row: Mapping[str, Any], source: str) -> None:
    if template is None or not hasattr(template, "fields"):
        return
    optional = getattr(template, "optional", ())
    for f in template.fields:
        if f not in row and f not in optional:
            cols = ", ".join(map(str, row)) or "none"
            raise DataError(
                f"source {source!r}: template {type(template).__name__} reads field {{{f}}}, which is not a "
                f"column (columns: {cols}); add column_map: {{{f}: <your column>}} or change the template"
            )


class _Convert:
    """Row (after column_map) -> ``(ids, mask)``, or a chosen/rejected pair of them for preference
    data. A plain object (not a closure) so worker processes can receive it."""

    def __init__(self, tokenizer, kind: str, transform, chat_format, max_seq_len: int | None):
        self.tokenizer, self.kind, self.transform = tokenizer, kind, transform
        self.chat_format, self.max_seq_len = chat_format, max_seq_len

    def __call__(self, row: dict[str, Any]):
        tok, fmt, n = self.tokenizer, self.chat_format, self.max_seq_len
        if self.kind == "preference":
            chosen, rejected = self.transform(row)
            return (
                _trained(tokenize_messages(tok, chosen, fmt, n), "chosen"),
                _trained(tokenize_messages(tok, rejected, fmt, n), "rejected"),
            )
        if self.kind == "unpaired":  # (ids, mask, desirable)
            msgs, desirable = self.transform(row)
            return (*_trained(tokenize_messages(tok, msgs, fmt, n), "completion"), desirable)
        return _trained(tokenize_messages(tok, self.transform(row), fmt, n), "output")

    def convert_batch(self, rows: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        """`__call__` for many rows with one batched encode: ``("ok", value)`` or ``("bad", RowError)``."""
        convs: list[list] = []
        owners: list[int] = []  # row index of each conversation (two per preference row)
        out: list[tuple[str, Any]] = [("ok", None)] * len(rows)
        flags: dict[int, bool] = {}  # unpaired rows: desirable or not
        for k, row in enumerate(rows):
            try:
                msgs = self.transform(row)
                if self.kind == "unpaired":
                    msgs, flags[k] = msgs
            except RowError as exc:
                out[k] = ("bad", exc)
                continue
            pair = msgs if self.kind == "preference" else (msgs,)
            convs += pair
            owners += [k] * len(pair)
        results = tokenize_messages_batch(self.tokenizer, convs, self.chat_format, self.max_seq_len)
        names = {"preference": ("chosen", "rejected"), "unpaired": ("completion",)}.get(
            self.kind, ("output",)
        )
        got: dict[int, list] = {}
        for k, res in zip(owners, results):
            got.setdefault(k, []).append(res)
        for k, parts in got.items():
            try:
                values = []
                for res, what in zip(parts, names):
                    if isinstance(res, RowError):
                        raise res
                    values.append(_trained(res, what))
                if self.kind == "unpaired":
                    values[0] = (*values[0], flags[k])
                out[k] = ("ok", tuple(values) if self.kind == "preference" else values[0])
            except RowError as exc:
                out[k] = ("bad", exc)
        return out


_WORKER: dict[str, Any] = {}  # per worker process: the converter etc., sent once by the pool initializer


def _init_worker(column_map, convert, filter_fn, skip_blank, stop_at_bad) -> None:
    tok = getattr(convert, "tokenizer", None)
    if tok is not None and hasattr(tok, "encode_threads") and tok.encode_threads is None:
        tok.encode_threads = 1  # the worker processes already spread the rows over the CPUs
    _WORKER.update(
        column_map=column_map, convert=convert, filter_fn=filter_fn, skip_blank=skip_blank, stop=stop_at_bad
    )


def _worker_chunk(args) -> list[tuple[str, int, Any]]:
    start, rows = args
    w = _WORKER
    with _gc_paused():
        return _process_chunk(
            start, rows, w["column_map"], w["convert"], w["filter_fn"], w["skip_blank"], w["stop"]
        )


_BATCH = 512  # rows per batched encode


def _process_chunk(
    start, rows, column_map, convert, filter_fn, skip_blank, stop_at_bad
) -> list[tuple[str, int, Any]]:
    """Run rows ``start..`` of one chunk: ``[("ok"|"filtered"|"bad", row index, value), ...]``.
    With `stop_at_bad` the chunk ends at its first bad row (the caller raises on it). A converter
    with `convert_batch` gets the rows in batches (one tokenizer call per batch)."""
    out: list[tuple[str, int, Any]] = []
    batched = hasattr(convert, "convert_batch")
    pending: list[tuple[int, dict[str, Any]]] = []

    def flush() -> bool:
        results = convert.convert_batch([m for _, m in pending])
        for (idx, _), (status, value) in zip(pending, results):
            if status == "ok":
                out.append(("ok", idx, value))
            else:
                out.append(("bad", idx, (value.field, value.problem)))
                if stop_at_bad:
                    return False
        pending.clear()
        return True

    for k, row in enumerate(rows):
        idx = start + k
        try:
            mapped = apply_column_map(row, column_map)
            if (skip_blank is not None and skip_blank(mapped)) or (
                filter_fn is not None and not filter_fn(mapped)
            ):
                out.append(("filtered", idx, None))
                continue
            if batched:
                pending.append((idx, mapped))
                if len(pending) >= _BATCH and not flush():
                    return out
                continue
            out.append(("ok", idx, convert(mapped)))
        except RowError as exc:
            if batched and pending and not flush():
                return out
            out.append(("bad", idx, (exc.field, exc.problem)))
            if stop_at_bad:
                break
    if batched and pending:
        flush()
    return out


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while rows are converted: tokenizing builds hundreds of
    thousands of small lists (no cycles), and the collector's passes over them cost ~1/3 of the time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _picklable(*objs) -> bool:
    import pickle

    try:
        pickle.dumps(objs)
    except Exception:  # lambdas, local classes, open handles: run in this process instead
        return False
    return True


def run_rows(
    rows: list[dict[str, Any]],
    *,
    source_label: str,
    column_map: Mapping[str, str] | None,
    convert: Callable[[dict[str, Any]], Any],
    filter_fn: Callable[[dict[str, Any]], bool] | None,
    skip_bad_rows: bool,
    template=None,
    skip_blank: Callable[[dict[str, Any]], bool] | None = None,
    num_proc: int = 1,
) -> tuple[list[Any], _Report]:
    """Apply `column_map`, `filter_fn` and `convert` to every row; collect results and a report.

    `num_proc > 1` converts chunks of rows in that many spawned worker processes (results keep row
    order; falls back to one process when `convert`/`filter_fn` cannot be pickled, e.g. a lambda).
    Raises `DataError` naming source, row and field for the first bad row (unless `skip_bad_rows`),
    for an empty source, and when no row is usable.
    """
    report = _Report(rows=len(rows))
    if not rows:
        raise DataError(f"source {source_label!r}: has no rows; check the file, split or filter")
    if not isinstance(num_proc, int) or num_proc < 1:
        raise DataError(f"num_proc: must be a positive integer, got {num_proc!r}")
    try:
        first = apply_column_map(rows[0], column_map)
    except RowError as exc:
        raise DataError(f"{where(source_label, 0, exc.field)}: {exc.problem}") from None
    _check_template_fields(template, first, source_label)
    cmap = dict(column_map) if column_map else None
    stop = not skip_bad_rows
    if num_proc > 1 and len(rows) >= 2 * num_proc and _picklable(convert, filter_fn, skip_blank):
        import multiprocessing

        size = -(-len(rows) // (num_proc * 4))
        chunks = [(i, rows[i : i + size]) for i in range(0, len(rows), size)]
        ctx = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads (torch, tokenizers)
        init = (cmap, convert, filter_fn, skip_blank, stop)
        with ctx.Pool(num_proc, initializer=_init_worker, initargs=init) as pool:
            results = [r for part in pool.map(_worker_chunk, chunks) for r in part]
    else:
        with _gc_paused():
            results = _process_chunk(0, rows, cmap, convert, filter_fn, skip_blank, stop)
    out = []
    for status, idx, value in results:
        if status == "ok":
            out.append(value)
        elif status == "filtered":
            report.filtered += 1
        else:
            field, problem = value
            msg = f"{where(source_label, idx, field)}: {problem}"
            if not skip_bad_rows:
                raise DataError(msg + " (or set skip_bad_rows: true to drop such rows)")
            report.skipped += 1
            report.first_problem = report.first_problem or msg
    if not out:  # one line: the error alone, without the skip warning before it
        why = f"; first problem: {report.first_problem}" if report.first_problem else ""
        raise DataError(
            f"source {source_label!r}: no usable rows out of {report.rows} ({report.skipped} bad, "
            f"{report.filtered} filtered){why}; fix the rows, or the column_map/template/filter that rejects them"
        )
    if report.skipped:
        log.warning(
            "engine.data: %s: skipped %d of %d rows (first: %s)",
            source_label,
            report.skipped,
            report.rows,
            report.first_problem,
        )
    return out, report


def default_name(source: Any) -> str:
    """A short source name for logs (``loss/<name>``): a file's stem, a Hub name's last part."""
    if isinstance(source, (list, tuple)):
        return "rows"
    s = str(source).rstrip("/")
    base = s.rsplit("/", 1)[-1]
    for suffix in (".gz", ".json", ".jsonl", ".csv", ".parquet", ".txt"):
        base = base.removesuffix(suffix).removesuffix(suffix)
    return base or s


class OneSourceDataset(Dataset):
    """What every single-source dataset carries besides its samples: `source_names` (its one name),
    `source_id` (0 unless given; samples carry it), the tokenizer's `pad_id`, and the load report's
    `rows`, `skipped` and `filtered` counts."""

    kind = "sft"  # what a sample holds: "sft", "preference", "unpaired" or "prompt"

    def __init__(self, *, name: str, pad_id: int, report: _Report, source_id: int = 0) -> None:
        self.source_names = [name]
        self.source_id = source_id
        self.pad_id = pad_id
        self.rows, self.skipped, self.filtered = report.rows, report.skipped, report.filtered

    def _index(self, i: int) -> int:
        """`i` counted from the end when negative; IndexError outside the dataset."""
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return i


class TokenizedDataset(OneSourceDataset):
    """Samples of one source, tokenized (see the module docstring for the sample layout).

    Build it with a builder (`instruct_dataset`, `chat_dataset`, `text_completion_dataset`, ...).
    `mask(i)` gives sample i's loss mask over its tokens; `lengths` the token counts.
    """

    kind = "sft"

    def __init__(self, flat: _Flat, *, name: str, pad_id: int, report: _Report, source_id: int = 0):
        super().__init__(name=name, pad_id=pad_id, report=report, source_id=source_id)
        self._flat = flat

    def __len__(self) -> int:
        return len(self._flat)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids, mask = self._flat.get(self._index(i))
        return {"tokens": ids, "labels": shifted_labels(ids, mask), "source_id": self.source_id}

    def mask(self, i: int) -> list[bool]:
        return self._flat.get(i)[1]

    def sample_arrays(self, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Sample i as numpy: ``(tokens [n] int64, labels [n] int64 (shifted), source_id)``."""
        a, b = int(self._flat.offsets[i]), int(self._flat.offsets[i + 1])
        toks = self._flat.tokens[a:b].astype(np.int64)
        labels = np.full(b - a, IGNORE_INDEX, dtype=np.int64)
        if b - a > 1:
            nxt = toks[1:]
            labels[:-1] = np.where(self._flat.mask[a + 1 : b], IGNORE_INDEX, nxt)
        return toks, labels, self.source_id

    @property
    def lengths(self) -> np.ndarray:
        return self._flat.lengths()


class PreferenceDataset(OneSourceDataset):
    """Chosen/rejected pairs of one source, tokenized. Built by `preference_dataset`."""

    kind = "preference"

    def __init__(self, chosen: _Flat, rejected: _Flat, *, name: str, pad_id: int, report: _Report):
        super().__init__(name=name, pad_id=pad_id, report=report)
        self._chosen, self._rejected = chosen, rejected

    def __len__(self) -> int:
        return len(self._chosen)

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = self._index(i)
        c_ids, c_mask = self._chosen.get(i)
        r_ids, r_mask = self._rejected.get(i)
        return {
            "chosen_tokens": c_ids,
            "chosen_labels": shifted_labels(c_ids, c_mask),
            "rejected_tokens": r_ids,
            "rejected_labels": shifted_labels(r_ids, r_mask),
            "source_id": self.source_id,
        }

    @property
    def lengths(self) -> np.ndarray:
        return np.maximum(self._chosen.lengths(), self._rejected.lengths())


def _trained(ids_mask: tuple[list[int], list[bool]], what: str) -> tuple[list[int], list[bool]]:
    ids, mask = ids_mask
    if len(ids) < 2 or False not in islice(mask, 1, None):
        raise RowError(what, "leaves no token to train on (raise max_seq_len or check train_on_input)")
    return ids, mask


def _stable_repr(fn) -> bool:
    """True when `fn` is None or has a repr that names its settings (not an object address)."""
    return fn is None or " at 0x" not in repr(fn)


# The builders' common arguments (see engine.data.builders) that `build_tokenized` takes as they are.
_COMMON_ARGS = ("source", "split", "subset", "column_map", "max_seq_len", "filter_fn", "skip_bad_rows",
                "name", "cache", "num_proc")  # fmt: skip


def common_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The common arguments among a builder's `locals()`, for `build_tokenized(**common_args(locals()))`."""
    return {k: args[k] for k in _COMMON_ARGS if k in args}


def build_tokenized(
    tokenizer,
    *,
    kind: str,
    source: Any,
    split: str,
    subset: str | None,
    column_map: Mapping[str, str] | None,
    transform: Callable[[dict[str, Any]], Any],
    chat_format,
    max_seq_len: int | None,
    filter_fn: Callable | None,
    skip_bad_rows: bool,
    name: str | None,
    cache: bool,
    template=None,
    skip_blank: Callable | None = None,
    sample_by: str = "line",
    num_proc: int = 1,
) -> TokenizedDataset | PreferenceDataset:
    """Load, convert, tokenize (or fetch from the cache) one source. `kind` is "sft", "preference" or
    "unpaired" (KTO rows; see engine.data.unpaired)."""
    if max_seq_len is not None and (not isinstance(max_seq_len, int) or max_seq_len < 2):
        raise DataError(
            f"max_seq_len (of the dataset): must be an integer >= 2, got {max_seq_len!r}; set it to the "
            "longest sample in tokens to keep (e.g. 2048), or null for no limit"
        )
    if column_map is not None and (
        not isinstance(column_map, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in column_map.items())
    ):
        raise DataError(
            f"column_map: must map expected column -> your column, e.g. {{output: summary}}; got {column_map!r}"
        )
    label = default_name(source) if isinstance(source, (list, tuple)) else str(source)
    name = name or default_name(source)
    pad_id = int(getattr(tokenizer, "pad_id", 0) or 0)
    key = None
    if cache and _stable_repr(filter_fn):
        key = data_cache.cache_key(
            kind=kind,
            sample_by=sample_by,
            filter_fn=repr(filter_fn),
            source=source_fingerprint(source, split, subset),
            column_map=dict(column_map or {}),
            transform=repr(transform),
            chat_format=repr(chat_format),
            max_seq_len=max_seq_len,
            skip_bad_rows=skip_bad_rows,
            tokenizer=data_cache.tokenizer_fingerprint(tokenizer),
        )
        hit = data_cache.load(key)
        if hit is not None:
            arrays, meta = hit
            report = _Report(rows=meta["rows"], skipped=meta["skipped"], filtered=meta["filtered"])
            if kind == "preference":
                c = _Flat(arrays["c_tokens"], arrays["c_mask"], arrays["c_offsets"])
                r = _Flat(arrays["r_tokens"], arrays["r_mask"], arrays["r_offsets"])
                return PreferenceDataset(c, r, name=name, pad_id=pad_id, report=report)
            if kind == "unpaired":
                from engine.data.unpaired import UnpairedDataset

                flat = _Flat(arrays["tokens"], arrays["mask"], arrays["offsets"])
                return UnpairedDataset(flat, arrays["desirable"], name=name, pad_id=pad_id, report=report)
            return TokenizedDataset(
                _Flat(arrays["tokens"], arrays["mask"], arrays["offsets"]),
                name=name,
                pad_id=pad_id,
                report=report,
            )

    rows = load_rows(source, split, subset, sample_by=sample_by)

    convert = _Convert(tokenizer, kind, transform, chat_format, max_seq_len)
    desirable = None
    # The per-row lists die (stored flat) inside the pause: a collection right after it would walk
    # all of them (~3% of an Alpaca-1k build, more beside a big live heap).
    with _gc_paused():
        out, report = run_rows(
            rows,
            source_label=label,
            column_map=column_map,
            convert=convert,
            filter_fn=filter_fn,
            skip_bad_rows=skip_bad_rows,
            template=template,
            skip_blank=skip_blank,
            num_proc=num_proc,
        )
        if kind == "preference":
            flats = (_Flat.build([p[0] for p in out]), _Flat.build([p[1] for p in out]))
        else:
            if kind == "unpaired":  # (ids, mask, desirable) per row
                desirable = np.array([o[2] for o in out], dtype=bool)
                out = [o[:2] for o in out]
            flats = (_Flat.build(out),)
        del out
    meta = {"rows": report.rows, "skipped": report.skipped, "filtered": report.filtered}
    if kind == "preference":
        c, r = flats
        if key is not None:
            data_cache.save(
                key,
                {
                    "c_tokens": c.tokens,
                    "c_mask": c.mask,
                    "c_offsets": c.offsets,
                    "r_tokens": r.tokens,
                    "r_mask": r.mask,
                    "r_offsets": r.offsets,
                },
                meta,
            )
        return PreferenceDataset(c, r, name=name, pad_id=pad_id, report=report)
    (flat,) = flats
    if desirable is not None:
        from engine.data.unpaired import UnpairedDataset

        if key is not None:
            arrays = {
                "tokens": flat.tokens,
                "mask": flat.mask,
                "offsets": flat.offsets,
                "desirable": desirable,
            }
            data_cache.save(key, arrays, meta)
        return UnpairedDataset(flat, desirable, name=name, pad_id=pad_id, report=report)
    if key is not None:
        data_cache.save(key, {"tokens": flat.tokens, "mask": flat.mask, "offsets": flat.offsets}, meta)
    return TokenizedDataset(flat, name=name, pad_id=pad_id, report=report)


__all__ = ["IGNORE_INDEX", "PreferenceDataset", "TokenizedDataset", "build_tokenized"]
