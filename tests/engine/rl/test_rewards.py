"""Reward functions on hand-written completions."""

import pytest

from engine.rl.rewards import answers_match, final_answer, format_reward, math_reward, parse_number


@pytest.mark.parametrize(
    "text,want",
    [("so 3 + 4 = 7\n#### 7", "7"), ("The answer is \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}"),
     ("#### 1,234 apples", "1,234 apples"), ("no final answer 42", None), ("\\boxed{x^{2}} and \\boxed{5}", "5")],
)  # fmt: skip
def test_final_answer(text, want):
    assert final_answer(text) == want


def test_numbers_compare_numerically():
    assert parse_number("$1,234.50") == 1234.5
    assert parse_number("\\frac{3}{4}") == 0.75
    assert answers_match("7.0", "Natalia sold 48/2 = 24 clips...\n#### 7")
    assert answers_match("1,000", "1000")
    assert not answers_match("8", "7")
    assert answers_match("abc", "abc") and not answers_match(None, "1")


def test_math_and_format_rewards_on_gsm8k_rows(shared_assets):
    import json

    rows = [json.loads(line) for line in (shared_assets / "data" / "gsm8k_train.jsonl").open()][:5]
    answers = [r["answer"] for r in rows]
    right = [f"thinking...\n#### {final_answer(a)}" for a in answers]
    wrong = [f"#### {parse_number(final_answer(a)) + 1}" for a in answers]
    assert math_reward(completions=right, answers=answers) == [1.0] * 5
    assert math_reward(completions=wrong, answers=answers) == [0.0] * 5
    assert math_reward(completions=["\\boxed{" + final_answer(answers[0]) + "}"], answers=answers[:1]) == [
        1.0
    ]
    assert format_reward(completions=["x\n#### 5", "x 5", "#### 5 and more text\nok"]) == [1.0, 0.0, 0.0]
