"""A tiny verifiable task for tests and benchmarks: "answer with the digit after X".

The prompt is `<bos>X>` for a digit X; the reward is 1 when the completion starts with (X+1) mod 10.
It comes with a character tokenizer of 16 symbols, so a 2-layer model learns it by RL in a few CPU
seconds: a random policy starts near 1/16 and GRPO raises it to most of the prompts.
"""

from __future__ import annotations

import random
from typing import Any

from torch.utils.data import Dataset

_SYMBOLS = list("0123456789>= ")


class DigitTokenizer:
    """Characters `0-9 > =` and space, plus `<pad>`=0, `<bos>`=1, `<eos>`=2 (vocab_size 16)."""

    pad_id, bos_id, eos_id = 0, 1, 2
    unk_id = None
    vocab_size = 3 + len(_SYMBOLS)
    adds_bos = True

    def __init__(self) -> None:
        self._ids = {c: 3 + i for i, c in enumerate(_SYMBOLS)}

    @property
    def stop_tokens(self) -> list[int]:
        return [self.eos_id]

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Raises ValueError naming a character outside the vocabulary."""
        bad = [c for c in text if c not in self._ids]
        if bad:
            raise ValueError(f"DigitTokenizer: character {bad[0]!r} is not in its vocabulary (0-9 > = space)")
        ids = [self._ids[c] for c in text]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        names = {0: "<pad>", 1: "<bos>", 2: "<eos>"}
        out = []
        for i in ids:
            i = int(i)
            if i < 3:
                if not skip_special_tokens:
                    out.append(names[i])
            else:
                out.append(_SYMBOLS[i - 3])
        return "".join(out)


class DigitSuccessorPrompts(Dataset):
    """`n` prompts `X>` (digits drawn with `seed`), answers `(X+1) % 10`; a prompt dataset
    (`{"prompt_tokens", "answer", "source_id"}`, `kind = "prompt"`)."""

    kind = "prompt"

    def __init__(self, tokenizer, *, n: int = 200, seed: int = 0) -> None:
        r = random.Random(seed)
        self.source_names = ["digit_successor"]
        self._rows = []
        for _ in range(n):
            x = r.randrange(10)
            self._rows.append((tokenizer.encode(f"{x}>", add_bos=True, add_eos=False), str((x + 1) % 10)))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids, answer = self._rows[i]
        return {"prompt_tokens": list(ids), "answer": answer, "source_id": 0}


def digit_successor_dataset(tokenizer, *, n: int = 200, seed: int = 0) -> DigitSuccessorPrompts:
    """Builder for configs (`_component_: engine.rl.toy_task.digit_successor_dataset`)."""
    return DigitSuccessorPrompts(tokenizer, n=n, seed=seed)


def digit_successor_reward(*, completions: list[str], answers: list[str], **_: object) -> list[float]:
    """1.0 when the completion (stripped) starts with the expected digit, else 0."""
    return [1.0 if c.strip()[:1] == a else 0.0 for c, a in zip(completions, answers, strict=True)]
