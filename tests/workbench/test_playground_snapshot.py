"""Snapshot (pytest-textual-snapshot) of the Playground: two tiny random chat models side by side, one
greedy exchange each. The reply timing comes from a fixed clock so the status lines are stable.

Update after an intended visual change with
`pytest tests/workbench/test_playground_snapshot.py --snapshot-update`.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.engine.generation.tiny_chat_model import make_chat_model_dir
from workbench.app import make_app

SIZE = (110, 34)


@pytest.fixture
def two_models(tmp_path, tunebench_home, monkeypatch):
    from workbench import chat_models

    clock = threading.local()

    def two_seconds_a_reply() -> float:  # start and end of each reply, in the thread generating it
        clock.n = getattr(clock, "n", -1) + 1
        return 2.0 * clock.n

    monkeypatch.setattr(chat_models, "perf_counter", two_seconds_a_reply)
    return [
        str(make_chat_model_dir(tmp_path / name, seed=seed))
        for name, seed in (("model_a", 0), ("model_b", 1))
    ]


async def _until(pilot, predicate, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        await pilot.pause(0.1)
    assert predicate(), "the Playground did not reach the state to snapshot"
    await pilot.pause(0.3)


def test_playground_screen(snap_compare, two_models):
    async def ready(pilot):
        app = pilot.app
        app.push_screen(app.make_screen("playground", models=two_models))
        await _until(pilot, lambda: len(app.screen.query("ChatColumn")) == 2)
        screen = app.screen
        await _until(pilot, lambda: all(screen.column(i).status.startswith("ready") for i in range(2)))
        screen.query_one("SamplingControls").set_values(max_tokens="32")
        prompt = screen.query_one("#prompt")
        prompt.cursor_blink = False  # a blinking cursor makes the picture depend on the moment it is taken
        prompt.value = "what is two plus two?"
        prompt.focus()
        await pilot.press("enter")
        await _until(pilot, lambda: all(len(screen.column(i).messages) == 2 for i in range(2)))

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)
