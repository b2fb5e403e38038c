"""The last lines of a run's `stdout.log`, appended as the file grows."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Log


def read_new_text(path: Path, offset: int, max_bytes: int = 65536) -> tuple[str, int]:
    """Text appended to `path` since byte `offset` (at most the last `max_bytes`), and the new offset.

    A missing file reads as empty; a file that shrank (rotated) is read from the start.
    """
    try:
        size = path.stat().st_size
    except OSError:
        return "", offset
    if size < offset:
        offset = 0
    if size == offset:
        return "", offset
    start = max(offset, size - max_bytes)
    with path.open("rb") as fh:
        fh.seek(start)
        data = fh.read(size - start)
    return data.decode("utf-8", errors="replace"), size


class LogTail(Log):
    """A scrolling log of at most `max_lines` lines; `append_text` adds a chunk read by a worker."""

    DEFAULT_CSS = """
    LogTail {
        height: 7;
        border: round $panel;
    }
    """

    def __init__(self, max_lines: int = 400, **kwargs) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, **kwargs)
        self.border_title = "log"

    def append_text(self, text: str) -> None:
        if text:
            self.write(text)
