"""A tiny synthetic preference set for reward-model and preference-loss tests: "answer with the digit
after the FIRST digit of the prompt".

Prompts are `<bos>XYZW>` (the first digit X, then `distractors` random digits); the chosen response
is `(X+1) mod 10`, the rejected one any other digit. With 3 distractors there are 10^4 prompts, so a
held-out split holds prompts the model never saw: to score it, the model has to learn the rule (read
the first digit), not memorise sequences. Uses `engine.rl.toy_task.DigitTokenizer`.

`DigitUnpaired` is the same task as KTO's unpaired data: each prompt appears once, with either the
right digit (desirable) or a wrong one (undesirable), never both.
"""

from __future__ import annotations

import random
from typing import Any

from torch.utils.data import Dataset

IGNORE = -100


def _sample(prompt: list[int], response: list[int]) -> tuple[list[int], list[int]]:
    """tokens = prompt + response; labels shifted (labels[i] = tokens[i+1]) on the response only."""
    tokens = prompt + response
    labels = [IGNORE] * (len(prompt) - 1) + response + [IGNORE]
    return tokens, labels


class DigitPreferencePairs(Dataset):
    """`n` preference samples (`chosen_tokens`, `chosen_labels`, `rejected_tokens`, `rejected_labels`,
    `source_id`) as the DPO collate expects."""

    def __init__(self, tokenizer, *, n: int = 512, distractors: int = 3, seed: int = 0) -> None:
        if n < 1 or distractors < 0:
            raise ValueError(f"n ({n}) must be >= 1 and distractors ({distractors}) >= 0")
        r = random.Random(seed)
        self.source_names = ["digit_preferences"]
        self._rows = []
        for _ in range(n):
            digits = [r.randrange(10) for _ in range(1 + distractors)]
            good = (digits[0] + 1) % 10
            bad = r.choice([d for d in range(10) if d != good])
            prompt = tokenizer.encode("".join(map(str, digits)) + ">", add_bos=True, add_eos=False)
            chosen = tokenizer.encode(str(good), add_bos=False, add_eos=True)
            rejected = tokenizer.encode(str(bad), add_bos=False, add_eos=True)
            self._rows.append((_sample(prompt, chosen), _sample(prompt, rejected)))

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def lengths(self) -> list[int]:  # a property, as engine.data's datasets (mixes read it)
        return [max(len(c[0]), len(r[0])) for c, r in self._rows]

    def __getitem__(self, i: int) -> dict[str, Any]:
        (ct, cl), (rt, rl) = self._rows[i]
        return {"chosen_tokens": list(ct), "chosen_labels": list(cl), "rejected_tokens": list(rt),
                "rejected_labels": list(rl), "source_id": 0}  # fmt: skip


def digit_preference_dataset(
    tokenizer, *, n: int = 512, distractors: int = 3, seed: int = 0
) -> DigitPreferencePairs:
    """Builder for configs (`_component_: engine.rl.toy_preferences.digit_preference_dataset`)."""
    return DigitPreferencePairs(tokenizer, n=n, distractors=distractors, seed=seed)


class DigitUnpaired(Dataset):
    """`n` unpaired samples (`tokens`, `labels`, `desirable`, `source_id`) as `padded_collate_unpaired`
    expects; a share `desirable_share` of them desirable (the right digit), the rest a wrong digit:
    any other one, or with `wrong_offset` k always `(X+1+k) mod 10` (one tempting mistake, which
    plain likelihood on every completion would learn too)."""

    def __init__(
        self,
        tokenizer,
        *,
        n: int = 512,
        distractors: int = 3,
        desirable_share: float = 0.5,
        wrong_offset: int | None = None,
        seed: int = 0,
    ) -> None:
        if n < 1 or distractors < 0 or not 0.0 < desirable_share < 1.0 or wrong_offset in (0, 10):
            raise ValueError(
                f"n ({n}) must be >= 1, distractors ({distractors}) >= 0, desirable_share in (0, 1)"
            )
        r = random.Random(seed)
        self.source_names = ["digit_unpaired"]
        self._rows = []
        for _ in range(n):
            digits = [r.randrange(10) for _ in range(1 + distractors)]
            good = (digits[0] + 1) % 10
            desirable = r.random() < desirable_share
            wrong = (
                r.choice([d for d in range(10) if d != good])
                if wrong_offset is None
                else (good + wrong_offset) % 10
            )
            answer = good if desirable else wrong
            prompt = tokenizer.encode("".join(map(str, digits)) + ">", add_bos=True, add_eos=False)
            self._rows.append(
                (_sample(prompt, tokenizer.encode(str(answer), add_bos=False, add_eos=True)), desirable)
            )

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def lengths(self) -> list[int]:  # a property, as engine.data's datasets (mixes read it)
        return [len(t) for (t, _), _ in self._rows]

    def __getitem__(self, i: int) -> dict[str, Any]:
        (tokens, labels), desirable = self._rows[i]
        return {"tokens": list(tokens), "labels": list(labels), "desirable": desirable, "source_id": 0}


# The builder configs name (`_component_: engine.rl.toy_preferences.digit_unpaired_dataset`): the class
# itself, so its arguments and defaults are declared once.
digit_unpaired_dataset = DigitUnpaired
