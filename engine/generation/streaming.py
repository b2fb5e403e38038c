"""A completion as text while it is generated: token ids in, the text each one adds out.

    stream = TextStream(tok)
    generate(model, [ids], max_new_tokens=64, on_step=stream.on_step(lambda piece: print(piece, end="")))
    rest = stream.finish()  # what is left once generation ended

Decoding a token on its own is wrong for byte-level vocabularies (one character may span two tokens)
and for SentencePiece (the leading space depends on the token before). So every push decodes all ids
so far and hands out the new suffix; nothing is handed out while the text ends in an unfinished
character (U+FFFD) or no longer starts with what was already handed out. `finish()` hands out the
rest, so the pieces concatenate to `tokenizer.decode(ids)` whenever decoding only ever appends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REPLACEMENT = "\ufffd"


class TextStream:
    """Incremental decoding of one completion.

    Args:
      tokenizer: anything with `decode(ids, skip_special_tokens=...)` (an engine `Tokenizer`).
      skip_special_tokens: passed to `decode` (default True: a stop token adds no text).
    """

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.shown = ""

    def _decode(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one generated id; returns the text it completes ("" when none is ready yet)."""
        self.ids.append(int(token_id))
        text = self._decode()
        if text.endswith(REPLACEMENT) or not text.startswith(self.shown):
            return ""
        piece, self.shown = text[len(self.shown) :], text
        return piece

    def finish(self) -> str | None:
        """The text not handed out yet, once generation ended; None when the full decode no longer
        starts with what was handed out (a decoder that rewrote earlier text: show `text` instead)."""
        text = self._decode()
        if not text.startswith(self.shown):
            return None
        piece, self.shown = text[len(self.shown) :], text
        return piece

    @property
    def text(self) -> str:
        """The whole completion so far, decoded."""
        return self._decode()

    def on_step(self, emit: Callable[[str], None], row: int = 0) -> Callable[[Any, Any], None]:
        """A `generate(on_step=...)` callback that pushes row `row`'s tokens while it runs and calls
        `emit(piece)` for each non-empty piece."""

        def step(tokens, running) -> None:
            if bool(running[row]):
                piece = self.push(int(tokens[row]))
                if piece:
                    emit(piece)

        return step
