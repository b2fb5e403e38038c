"""The generated demo dataset (deterministic, answers checked independently) and the preview API."""

from __future__ import annotations

import re
import statistics

import pytest

from engine.data import (
    demo_dataset,
    demo_rows,
    extract_answer,
    instruct_dataset,
    length_stats,
    preview_sample,
)


def _solve(q: str) -> str:
    """An independent solver for the five demo problem kinds, from the question text alone."""
    if m := re.match(r"\w+ has (\d+) \w+\. \w+ gets (\d+) more and then gives (\d+)", q):
        a, b, c = map(int, m.groups())
        return str(a + b - c)
    if m := re.match(r"(\d+) friends each have (\d+)", q):
        return str(int(m[1]) * int(m[2]))
    if m := re.match(r"A \w+ costs \$(\d+)\. \w+ buys (\d+) of them and pays with a \$(\d+) note", q):
        p, n, note = map(int, m.groups())
        return str(note - p * n)
    if m := re.match(r"How many (\w+) are in ([\d.]+) (\w+)\?", q):
        factor = {
            ("centimeters", "meters"): 100,
            ("meters", "kilometers"): 1000,
            ("grams", "kilograms"): 1000,
            ("minutes", "hours"): 60,
            ("seconds", "minutes"): 60,
            ("milliliters", "liters"): 1000,
            ("inches", "feet"): 12,
            ("hours", "days"): 24,
        }[(m[1], m[3])]
        return f"{float(m[2]) * factor:g}"
    if m := re.match(r"Reverse the letters of the word '(\w+)'", q):
        return m[1][::-1]
    if m := re.match(r"How many times does the letter '(\w)' appear in the word '(\w+)'", q):
        return str(m[2].count(m[1]))
    if m := re.match(r"Write the word '(\w+)' in capital letters", q):
        return m[1].upper()
    if m := re.match(r"Sort these numbers from smallest to largest: ([\d, ]+)\.", q):
        return ", ".join(map(str, sorted(int(x) for x in m[1].split(","))))
    raise AssertionError(f"unknown problem: {q}")


def test_demo_rows_deterministic_and_correct():
    rows = demo_rows()
    assert len(rows) == 3000 and rows == demo_rows()
    assert {r["kind"] for r in rows} == {"arithmetic", "price", "conversion", "string", "sorting"}
    assert len({r["question"] for r in rows}) > 2000  # mostly distinct problems
    for r in rows:
        assert extract_answer(r["answer"]) == _solve(r["question"]), r
    test = demo_rows(200, split="test")
    assert test != rows[:200]


def test_extract_answer():
    assert extract_answer("so 3 + 4 = 7.\n#### 7") == "7"
    assert extract_answer("#### 1\n#### 2 ") == "2"
    assert extract_answer("no marker") is None


def test_demo_dataset_tokenizes(tok):
    t = tok("smollm2")  # has a chat template -> the "auto" chat format uses it
    ds = demo_dataset(t, n=50)
    assert len(ds) == 50 and ds.source_names == ["demo"]
    text = t.decode([x for x in ds[0]["labels"] if x != -100], skip_special_tokens=False)
    assert text.endswith("<|im_end|>") and "####" in text
    plain = demo_dataset(t, n=5, chat_format=None)
    assert "Question: " in t.decode(plain[0]["tokens"])


def test_preview_sample_and_length_stats(tok):
    t = tok("llama3")
    rows = [{"input": f"What is {i} plus {i}?", "output": f"{2 * i}"} for i in range(1, 21)]
    ds = instruct_dataset(t, source=rows, template="Q: {input}\nA:")
    p = preview_sample(ds, 3, t)
    assert "".join(s for s, _ in p.segments) == t.decode(ds[3]["tokens"], skip_special_tokens=False)
    # A Llama 3 sample starts with <|begin_of_text|> even though this tokenizer.json adds none.
    assert p.segments[0] == ("<|begin_of_text|>Q: What is 4 plus 4?\nA:", True)
    assert p.segments[1][0].strip() == "8<|end_of_text|>" and p.segments[1][1] is False
    assert p.num_trained == sum(x != -100 for x in ds[3]["labels"]) and p.source == ds.source_names[0]
    assert p.render().startswith("[<|begin_of_text|>Q: What is 4 plus 4?")
    lengths = [len(ds[i]["tokens"]) for i in range(len(ds))]
    stats = length_stats(ds)
    assert stats["count"] == 20 and stats["max"] == max(lengths) and stats["total"] == sum(lengths)
    assert stats["mean"] == pytest.approx(statistics.mean(lengths))
    assert stats["p50"] == pytest.approx(statistics.median(lengths))


def test_demo_preference_pairs(tok):
    from engine.data import demo_preference_dataset, demo_preference_rows

    rows = demo_preference_rows(300)
    assert rows == demo_preference_rows(300)
    for r in rows:
        right, wrong = extract_answer(r["chosen"]), extract_answer(r["rejected"])
        assert right == _solve(r["question"]) and wrong != right, r
    t = tok("smollm2")
    ds = demo_preference_dataset(t, n=20)
    s = ds[0]
    assert s["chosen_tokens"] != s["rejected_tokens"]
    # both sides share the prompt: their masked prefix is identical
    n = next(i for i, x in enumerate(s["chosen_labels"]) if x != -100)
    assert s["chosen_tokens"][:n] == s["rejected_tokens"][:n]


def test_length_stats_of_combined_datasets_match_iteration(tok):
    from engine.data import ConcatDataset, PackedDataset, mix

    t = tok("smollm2")
    a = instruct_dataset(t, source=[{"input": f"q {i}" * (i % 4 + 1), "output": "a"} for i in range(9)])
    b = instruct_dataset(t, source=[{"input": f"w {i}", "output": "b b"} for i in range(5)])
    for ds in (
        ConcatDataset([a, b]),
        mix(datasets=[a, b], weights=[1, 2], num_samples=20),
        PackedDataset(ConcatDataset([a, b]), 64),
    ):
        real = [
            sum(1 for s in ds[i].get("source_ids", [0] * len(ds[i]["tokens"])) if s >= 0)
            for i in range(len(ds))
        ]
        assert length_stats(ds)["total"] == sum(real)
        assert length_stats(ds)["max"] == max(real) and length_stats(ds)["count"] == len(ds)
