"""The embedded demo dataset: instruction problems with verifiable answers, generated here.

Nothing is downloaded: `demo_rows(n, seed)` builds the same rows on every machine from a seeded RNG.
Five kinds of problem, each with a worked answer that ends in ``#### <answer>`` (GSM8K style, so
`extract_answer` and GRPO rewards can check a completion):
  - arithmetic word problems (buy / give away / share, two or three steps);
  - prices (unit price x quantity, with change from a note);
  - unit conversions (length, mass, time, volume);
  - string manipulation (reverse a word, count a letter, upper-case a word);
  - sorting a short list of numbers.
`demo_preference_rows` pairs each worked answer with a wrong one (the same steps, a corrupted final
result) for preference training (DPO) on the same problems.
"""

from __future__ import annotations

import random
import re
from typing import Any

NAMES = ["Mia", "Noah", "Ava", "Liam", "Zoe", "Omar", "Ines", "Kenji", "Lena", "Ravi", "Sara", "Tom"]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards", "books", "beads"]
SHOP = [("notebook", 3), ("pen", 2), ("sandwich", 5), ("ticket", 7), ("candle", 4), ("mug", 6), ("ball", 8)]
WORDS = [
    "planet",
    "garden",
    "window",
    "silver",
    "rocket",
    "banana",
    "pepper",
    "summer",
    "dragon",
    "kitten",
    "lemon",
    "river",
    "forest",
    "castle",
    "bridge",
    "mirror",
    "pillow",
    "orange",
    "tunnel",
    "anchor",
    "parrot",
    "wizard",
    "butter",
    "candle",
    "meadow",
    "island",
    "pirate",
    "violet",
    "button",
    "saddle",
]
# (from unit, to unit, factor, noun)
UNITS = [
    ("meters", "centimeters", 100, "length"),
    ("kilometers", "meters", 1000, "length"),
    ("kilograms", "grams", 1000, "mass"),
    ("hours", "minutes", 60, "time"),
    ("minutes", "seconds", 60, "time"),
    ("liters", "milliliters", 1000, "volume"),
    ("feet", "inches", 12, "length"),
    ("days", "hours", 24, "time"),
]
KINDS = ("arithmetic", "price", "conversion", "string", "sorting")
_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def _arithmetic(r: random.Random) -> tuple[str, str]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(5, 60), r.randint(2, 40)
    c = r.randint(1, a + b - 1)
    q = (
        f"{name} has {a} {item}. {name} gets {b} more and then gives {c} to a friend. "
        f"How many {item} does {name} have now?"
    )
    steps = f"{name} starts with {a} {item}.\nAfter getting {b} more: {a} + {b} = {a + b}.\n"
    steps += f"After giving away {c}: {a + b} - {c} = {a + b - c}.\n#### {a + b - c}"
    if r.random() < 0.4:
        k = r.choice([2, 3, 4, 5])
        total = (a + b - c) * k
        q = (
            f"{k} friends each have {a + b - c} {item}. They put all of them into one box. "
            f"How many {item} are in the box?"
        )
        steps = f"Each friend has {a + b - c} {item}.\n{k} * {a + b - c} = {total}.\n#### {total}"
    return q, steps


def _price(r: random.Random) -> tuple[str, str]:
    name, (thing, price) = r.choice(NAMES), r.choice(SHOP)
    n = r.randint(2, 12)
    cost = n * price
    note = next(v for v in (10, 20, 50, 100, 200) if v >= cost)
    q = f"A {thing} costs ${price}. {name} buys {n} of them and pays with a ${note} note. How much change does {name} get?"
    a = f"{n} {thing}s cost {n} * {price} = ${cost}.\nThe change is {note} - {cost} = ${note - cost}.\n#### {note - cost}"
    return q, a


def _conversion(r: random.Random) -> tuple[str, str]:
    src, dst, factor, _ = r.choice(UNITS)
    whole = r.random() < 0.6
    x = r.randint(2, 25) if whole else r.randint(3, 39) / 2
    value = x * factor
    x_s = f"{x:g}"
    v_s = f"{value:g}"
    q = f"How many {dst} are in {x_s} {src}?"
    a = f"One of the {src} is {factor} {dst}.\n{x_s} * {factor} = {v_s}.\n#### {v_s}"
    return q, a


def _string(r: random.Random) -> tuple[str, str]:
    word = r.choice(WORDS)
    kind = r.randrange(3)
    if kind == 0:
        rev = word[::-1]
        return (
            f"Reverse the letters of the word '{word}'.",
            f"Reading '{word}' from the end gives '{rev}'.\n#### {rev}",
        )
    if kind == 1:
        letter = r.choice(sorted(set(word)))
        count = word.count(letter)
        spelled = "-".join(word)
        return (
            f"How many times does the letter '{letter}' appear in the word '{word}'?",
            f"Spelled out: {spelled}. The letter '{letter}' appears {count} time{'s' if count != 1 else ''}.\n#### {count}",
        )
    up = word.upper()
    return (
        f"Write the word '{word}' in capital letters.",
        f"In capital letters '{word}' is '{up}'.\n#### {up}",
    )


def _sorting(r: random.Random) -> tuple[str, str]:
    nums = r.sample(range(1, 100), r.randint(3, 6))
    ordered = ", ".join(map(str, sorted(nums)))
    q = f"Sort these numbers from smallest to largest: {', '.join(map(str, nums))}."
    return (
        q,
        f"The smallest is {min(nums)} and the largest is {max(nums)}.\nIn order: {ordered}.\n#### {ordered}",
    )


_MAKERS = {
    "arithmetic": _arithmetic,
    "price": _price,
    "conversion": _conversion,
    "string": _string,
    "sorting": _sorting,
}


def demo_rows(n: int = 3000, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """`n` rows ``{"question", "answer", "kind"}``; the answer ends with ``#### <value>``.

    `split="test"` draws from a different stream (seed offset), so test rows are not training rows'
    copies (some short problems can still coincide by chance)."""
    if split not in ("train", "test"):
        from engine.data.data_errors import DataError

        raise DataError(f"split: the demo dataset has 'train' and 'test', not {split!r}")
    r = random.Random(f"tunebench-demo:{seed}:{split}")
    rows = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        q, a = _MAKERS[kind](r)
        rows.append({"question": q, "answer": a, "kind": kind})
    return rows


def _wrong(value: str, r: random.Random) -> str:
    """A plausible but wrong answer: a nearby number, or a corrupted word / list."""
    try:
        x = float(value)
    except ValueError:
        if ", " in value:  # a sorted list: swap two neighbours
            items = value.split(", ")
            k = r.randrange(len(items) - 1)
            items[k], items[k + 1] = items[k + 1], items[k]
            return ", ".join(items)
        if len(set(value)) > 1:
            chars = list(value)
            while "".join(chars) == value:
                r.shuffle(chars)
            return "".join(chars)
        return value + value[-1]
    delta = r.choice([-10, -3, -2, -1, 1, 2, 3, 10])
    return f"{x + delta:g}"


def demo_preference_rows(n: int = 1000, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """`n` rows ``{"question", "chosen", "rejected", "kind"}``: `chosen` is the worked answer of
    `demo_rows`, `rejected` the same text with its final result replaced by a wrong one."""
    r = random.Random(f"tunebench-demo-pref:{seed}:{split}")
    out = []
    for row in demo_rows(n, seed, split):
        right = extract_answer(row["answer"])
        wrong = _wrong(right, r)
        body = row["answer"][: row["answer"].rindex("####")]
        if right in body:
            head, tail = body.rsplit(right, 1)
            body = head + wrong + tail
        out.append(
            {
                "question": row["question"],
                "chosen": row["answer"],
                "rejected": f"{body}#### {wrong}",
                "kind": row["kind"],
            }
        )
    return out


def demo_layout(tokenizer, chat_format: Any) -> tuple[Any, Any]:
    """`(chat_format, template)` for the demo problems: `chat_format` "auto" is the tokenizer's chat
    template when it has one (an instruct model sees its usual layout), else None (plain text); the
    template is the plain ``Question: ...\\n\\nAnswer: `` prompt for plain text, the bare question
    inside a chat format."""
    from engine.data.templates import QuestionAnswerTemplate

    if chat_format == "auto":
        chat_format = "tokenizer" if getattr(tokenizer, "chat_template", None) else None
    return chat_format, (QuestionAnswerTemplate() if chat_format is None else "{question}")


def demo_preference_dataset(
    tokenizer,
    *,
    n: int = 1000,
    seed: int = 0,
    split: str = "train",
    chat_format: Any = "auto",
    max_seq_len: int | None = None,
    cache: bool = True,
):
    """Preference pairs over the demo problems (a `preference_dataset` over `demo_preference_rows`);
    `chat_format` as in `demo_dataset`."""
    from engine.data.builders import preference_dataset

    chat_format, template = demo_layout(tokenizer, chat_format)
    return preference_dataset(
        tokenizer,
        source=demo_preference_rows(n, seed, split),
        template=template,
        chat_format=chat_format,
        max_seq_len=max_seq_len,
        name="demo_preference",
        cache=cache,
    )


def demo_unpaired_dataset(
    tokenizer,
    *,
    n: int = 1000,
    seed: int = 0,
    split: str = "train",
    chat_format: Any = "auto",
    max_seq_len: int | None = None,
    cache: bool = True,
):
    """KTO's unpaired data over the demo problems (an `unpaired_dataset`): each question appears once,
    with its worked answer (``label: true``) or, every other row, the answer with a wrong result
    (``label: false``); `chat_format` as in `demo_dataset`."""
    from engine.data.unpaired import unpaired_dataset

    chat_format, template = demo_layout(tokenizer, chat_format)
    rows = [
        {
            "question": row["question"],
            "completion": row["chosen" if i % 2 == 0 else "rejected"],
            "label": i % 2 == 0,
        }
        for i, row in enumerate(demo_preference_rows(n, seed, split))
    ]
    return unpaired_dataset(
        tokenizer,
        source=rows,
        template=template,
        chat_format=chat_format,
        max_seq_len=max_seq_len,
        name="demo_unpaired",
        cache=cache,
    )


def demo_heldout_rows(per_kind: int = 20, seed: int = 0, train_n: int = 3000) -> list[dict[str, Any]]:
    """Held-out evaluation rows: `per_kind` rows of each kind from the `split="test"` stream, skipping
    every question that occurs among the first `train_n` training rows (the demo config's 3000 at
    seed 0), so no row was trained on. Rows are ``{"question", "answer", "target", "kind"}`` with
    `target` the answer after ``####``; `configs/eval/tasks/data/demo_heldout.jsonl` holds them."""
    seen = {row["question"] for row in demo_rows(train_n, seed, "train")}
    counts = dict.fromkeys(KINDS, 0)
    out: list[dict[str, Any]] = []
    r = random.Random(f"tunebench-demo:{seed}:test")
    i = 0
    while min(counts.values()) < per_kind:
        kind = KINDS[i % len(KINDS)]
        i += 1
        q, a = _MAKERS[kind](r)  # the same stream as demo_rows(..., split="test")
        if counts[kind] >= per_kind or q in seen:
            continue
        seen.add(q)  # no question twice
        counts[kind] += 1
        out.append({"question": q, "answer": a, "target": extract_answer(a), "kind": kind})
    return out


def extract_answer(text: str) -> str | None:
    """The text after the last ``####`` of a completion (stripped), or None when there is none."""
    if "####" not in text:
        return None
    m = _ANSWER.search(text[text.rindex("####") :])
    return m.group(1).strip() if m else None


def demo_dataset(
    tokenizer,
    *,
    n: int = 3000,
    seed: int = 0,
    split: str = "train",
    chat_format: Any = "auto",
    train_on_input: bool = False,
    mask_headers: bool = False,
    max_seq_len: int | None = None,
    packed: bool = False,
    cache: bool = True,
):
    """The demo instruction dataset, tokenized (an `instruct_dataset` over `demo_rows`).

    Args:
      n, seed, split: see `demo_rows`.
      chat_format: "auto" (default) uses the tokenizer's chat template when it has one, else the
        plain ``Question: ...\\n\\nAnswer: `` prompt (see `demo_layout`); or any chat format / None
        for plain.
      train_on_input, mask_headers, max_seq_len, packed, cache: as in `instruct_dataset`.
    """
    from engine.data.builders import instruct_dataset

    chat_format, template = demo_layout(tokenizer, chat_format)
    return instruct_dataset(
        tokenizer,
        source=demo_rows(n, seed, split),
        template=template,
        column_map={"output": "answer"},
        train_on_input=train_on_input,
        chat_format=chat_format,
        mask_headers=mask_headers,
        max_seq_len=max_seq_len,
        packed=packed,
        name="demo",
        cache=cache,
    )
