"""The held-out demo task (configs/eval/tasks/demo_em.yaml): its rows are `demo_heldout_rows()`,
none of them a training question of the demo config, and lm-eval scores it as documented (checked
with answers whose scores are known: the references themselves, and answers without the format)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.model import LM  # noqa: E402

from engine.data.demo import KINDS, WORDS, demo_heldout_rows, demo_rows  # noqa: E402
from engine.eval import evaluate  # noqa: E402
from engine.eval.tasks import BUILTIN_TASK_DIR  # noqa: E402

DATA = BUILTIN_TASK_DIR / "data" / "demo_heldout.jsonl"


def test_the_data_file_is_the_heldout_split_and_never_a_training_question():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert rows == demo_heldout_rows()  # regenerate the file from the function after changing it
    assert len(rows) == 100 and {k: sum(r["kind"] == k for r in rows) for k in KINDS} == dict.fromkeys(
        KINDS, 20
    )
    trained = {r["question"] for r in demo_rows(3000, 0, "train")}  # the demo config's n and seed
    assert not trained & {r["question"] for r in rows}
    assert len({r["question"] for r in rows}) == 100


class Answers(LM):
    """Answers every prompt with `answer(question)` (the prompt is the question: no chat template)."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def generate_until(self, requests, disable_tqdm: bool = False):
        return [self.answer(req.args[0]) for req in requests]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise AssertionError("demo_em only generates")

    loglikelihood_rolling = loglikelihood


def _scores(answer) -> dict[str, float]:
    report = evaluate(Answers(answer), "demo_em")
    return {s.metric: s.value for s in report.scores if s.task == "demo_em"}


def test_reference_answers_score_one_and_unformatted_answers_zero():
    rows = {r["question"]: r for r in demo_heldout_rows()}
    numeric = sum(bool(re.fullmatch(r"-?\d+(\.\d+)?", r["target"])) for r in rows.values())
    perfect = _scores(lambda q: rows[q]["answer"])
    assert perfect["exact_match,strict-match"] == 1.0
    # the last number of a worked answer is its result when the result is a number
    assert perfect["exact_match,flexible-extract"] == pytest.approx(numeric / 100)
    assert 0.4 < numeric / 100 < 0.9  # arithmetic, prices, conversions and letter counts
    unformatted = _scores(lambda q: f"The answer is {rows[q]['target']}")  # right, but no "####"
    assert unformatted["exact_match,strict-match"] == 0.0
    assert unformatted["exact_match,flexible-extract"] == pytest.approx(numeric / 100)
    # Every "Reverse the letters ..." and "... in capital letters" question (one of each per word) is
    # among the 3000 training rows, so the held-out string rows are all letter counts and no target
    # holds a letter: case sensitivity (ignore_case: false) never decides a held-out score.
    trained = {r["question"] for r in demo_rows(3000, 0, "train")}
    for word in WORDS:
        assert f"Reverse the letters of the word '{word}'." in trained
        assert f"Write the word '{word}' in capital letters." in trained
    strings = [r["question"] for r in rows.values() if r["kind"] == "string"]
    assert all(q.startswith("How many times does the letter ") for q in strings)
    assert not any(c.isalpha() for r in rows.values() for c in r["target"])
    # strict-match reads the last "####" only, and drops a trailing "."
    restated = _scores(lambda q: "#### 0\nSo: #### " + rows[q]["target"] + ".")
    assert restated["exact_match,strict-match"] == 1.0
    # exact, not a prefix: one extra digit is wrong
    longer = _scores(lambda q: "#### " + rows[q]["target"] + "0")
    assert longer["exact_match,strict-match"] == 0.0
