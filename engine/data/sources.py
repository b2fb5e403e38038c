"""Reading rows from a source: a local file or folder, a Hugging Face Hub dataset name, or rows in memory.

Local files are read with `datasets` by extension: ``.json``/``.jsonl`` (also ``.gz``) -> "json",
``.csv`` -> "csv", ``.parquet`` -> "parquet", ``.txt`` -> "text" (one row per line, column ``text``).
A folder is read as all files of its most common supported extension. Anything else is a Hub name.
Every failure is a `DataError` naming the source.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from engine.data.data_errors import DataError

_KINDS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


def local_kind(path: Path) -> str | None:
    """The `datasets` builder for a local file (``.gz`` looked through), or None if unsupported."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".bz2", ".xz", ".zst"):
        suffixes = suffixes[:-1]
    return _KINDS.get(suffixes[-1]) if suffixes else None


def _folder_files(folder: Path) -> tuple[str, list[str]]:
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and local_kind(p)]
    if not files:
        raise DataError(
            f"source {str(folder)!r}: folder holds no .json, .jsonl, .csv, .parquet or .txt files; "
            "point source at a data file"
        )
    kind, _ = Counter(local_kind(p) for p in files).most_common(1)[0]
    return kind, [str(p) for p in files if local_kind(p) == kind]


def source_fingerprint(source: Any, split: str, subset: str | None) -> str:
    """What identifies a source's content for the cache: path + size + mtime of every file for local
    data, the name/split/subset for the Hub (its own cache handles revisions)."""
    if isinstance(source, (list, tuple)):
        import hashlib
        import json

        return "rows:" + hashlib.sha256(json.dumps(source, sort_keys=True, default=str).encode()).hexdigest()
    path = Path(str(source)).expanduser()
    if path.exists():
        files = [path] if path.is_file() else [Path(f) for f in _folder_files(path)[1]]
        stats = [f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
        return f"local:{split}:" + "|".join(stats)
    return f"hub:{source}:{subset}:{split}"


def load_rows(
    source: Any, split: str = "train", subset: str | None = None, sample_by: str = "line"
) -> list[dict[str, Any]]:
    """Rows of `source` as a list of dicts.

    Args:
      source: a local file/folder path, a Hub dataset name (``"yahma/alpaca-cleaned"``) or a list of dicts.
      split: the split (``"train"``; slices like ``"train[:100]"`` work). Local files have only "train".
      subset: the Hub config name (e.g. ``"main"`` for GSM8K).
      sample_by: for local .txt files: "line" (a row per line), "paragraph" (blank-line separated)
        or "document" (a row per file).
    Raises `DataError` when the file is missing or unreadable, or the Hub dataset cannot be fetched.
    """
    if isinstance(source, (list, tuple)):
        return [dict(r) for r in source]
    if sample_by not in ("line", "paragraph", "document"):
        raise DataError(f"sample_by: {sample_by!r} is not one of line, paragraph, document")
    if not isinstance(split, str) or not split.strip():
        raise DataError(
            f"split: expected a split name like 'train' (slices like 'train[:90%]' work), got {split!r}"
        )
    if not isinstance(source, (str, os.PathLike)) or not str(source).strip():
        raise DataError(f"source: expected a file, folder or Hub dataset name, got {source!r}")
    import datasets

    datasets.disable_progress_bars()
    path = Path(str(source)).expanduser()
    try:
        if path.is_file():
            kind = local_kind(path)
            if kind is None:
                raise DataError(
                    f"source {str(source)!r}: unsupported file type; use .json, .jsonl, .csv, .parquet or .txt (optionally .gz)"
                )
            if not os.access(path, os.R_OK):
                raise DataError(f"source {str(source)!r}: file is not readable; fix its permissions")
            if _is_blank(path):
                raise DataError(
                    f"source {str(source)!r}: the file is empty; give a file with at least one row"
                )
            extra = {"sample_by": sample_by} if kind == "text" else {}
            with _quiet_datasets():
                ds = datasets.load_dataset(kind, data_files=str(path), split=split, **extra)
        elif path.is_dir():
            kind, files = _folder_files(path)
            extra = {"sample_by": sample_by} if kind == "text" else {}
            with _quiet_datasets():
                ds = datasets.load_dataset(kind, data_files=files, split=split, **extra)
        elif (
            any(sep in str(source) for sep in ("./", "/.", "\\"))
            or str(source).startswith(("/", "~"))
            or local_kind(path)
        ):
            raise DataError(f"source {str(source)!r}: no such file or folder; check the path")
        else:
            ds = datasets.load_dataset(str(source), subset, split=split)
    except DataError:
        raise
    except ValueError as exc:
        if "Unknown split" in str(exc) or "Bad split" in str(exc):
            hint = (
                "local files have only the 'train' split"
                if path.exists()
                else "check the split names on the Hub"
            )
            raise DataError(
                f"source {str(source)!r}: split {split!r} does not exist ({hint}; slices like 'train[:90%]' work)"
            ) from None
        if "corresponds to no data" in str(exc):
            raise DataError(
                f"source {str(source)!r}: holds no rows; give data with at least one row"
            ) from None
        raise DataError(
            f"source {str(source)!r}: cannot be read as a dataset ({str(exc).splitlines()[0][:300]})"
        ) from None
    except (
        Exception
    ) as exc:  # datasets raises many types (ArrowInvalid, DatasetNotFoundError, ConnectionError...)
        if path.exists():  # a local file that does not parse: the parser's own words (row, column)
            root = _root_cause(exc)
            first = (str(root).strip().splitlines() or [type(root).__name__])[0][:300]
            raise DataError(
                f"source {str(source)!r}: cannot be read as {local_kind(path) or 'data'} "
                f"({type(root).__name__}: {first}); fix the file's format"
            ) from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise DataError(
            f"source {str(source)!r}: cannot be read as a dataset ({type(exc).__name__}: {first}); "
            "check the file's format, or that the Hub name and split exist and the Hub is reachable"
        ) from None
    try:
        return ds.to_list()
    except UnicodeDecodeError as exc:  # the JSON reader keeps bytes that are not UTF-8; they fail here
        raise DataError(
            f"source {str(source)!r}: is not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} in a "
            f"value: {exc.reason}); save the file as UTF-8"
        ) from None


def _is_blank(path: Path) -> bool:
    """True when a file (.gz/.bz2/.xz looked through) holds nothing but whitespace; reads at most
    64 KiB. A compressed file that cannot be opened is left to the reader's own error."""
    opener = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}.get(path.suffix.lower())
    if path.suffix.lower() in (".parquet", ".zst"):
        return path.stat().st_size == 0
    try:
        if opener is None:
            with open(path, "rb") as f:
                head = f.read(65536)
            return not head.strip() and path.stat().st_size <= len(head)
        import importlib

        with importlib.import_module(opener).open(path, "rb") as f:
            head = f.read(65536)
            return not head.strip() and not f.read(1)
    except (OSError, EOFError, ValueError):
        return False


def _root_cause(exc: BaseException) -> BaseException:
    """The parser's error behind `datasets`' wrapper: the first exception of the chain raised outside
    `datasets` (e.g. pyarrow's ArrowInvalid naming the row), else `exc` itself."""
    seen = {id(exc)}
    cur: BaseException | None = exc
    while cur is not None and type(cur).__module__.split(".")[0] == "datasets":
        nxt = cur.__cause__ or cur.__context__
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        cur = nxt
    return cur or exc


class _quiet_datasets:
    """Silences `datasets`' logger while reading (it logs parser errors that we re-raise in one line)."""

    def __enter__(self) -> None:
        import datasets

        self._level = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        import datasets

        datasets.logging.set_verbosity(self._level)
