"""Pilot tests of the Playground screen on tiny random chat models made here (no ../shared): a reply
streams into its column piece by piece and ends equal to the engine's greedy generation, two models
answer the same message in two columns, leaving the screen frees the models, the stop key ends a
reply mid-stream, bad models (a missing folder, a folder that is not one or has no weights, a run
without checkpoints) are one line, sampling settings reach the generation, and a LoRA run's checkpoint
beside its base answers as transformers (+ peft) does greedily on the same weights. It is reached from the app's f10, the Runs screen (`a` on the selected run) and Compare (`a`)."""

from __future__ import annotations

import gc
import re
import shutil
import time
import weakref
from pathlib import Path

import pytest

from tests.engine.generation.tiny_chat_model import make_chat_model_dir
from tests.workbench.pilot_wait import wait_for
from workbench.app import make_app
from workbench.chat_models import SamplingSettings

SIZE = (110, 34)
QUESTION = "what is two plus two?"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("playground")
    return make_chat_model_dir(root / "model_a", seed=0), make_chat_model_dir(root / "model_b", seed=1)


def greedy(folder: Path, question: str, n: int) -> str:
    """What the engine generates greedily for one user message with the chat template."""
    import torch

    from engine.data.tokenizers import load_tokenizer
    from engine.generation import generate
    from engine.models import from_pretrained

    tok = load_tokenizer(folder)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    model = from_pretrained(folder, dtype=torch.float32)
    out = generate(model, [ids], max_new_tokens=n, stop_tokens=tok.stop_tokens, pad_id=tok.pad_id)
    return tok.decode(out.completions[0], skip_special_tokens=True)


async def playground_shown(pilot):
    """The Playground screen once it is on top with its columns mounted."""
    from workbench.screens.playground import PlaygroundScreen

    app = pilot.app
    return await wait_for(
        pilot,
        lambda: isinstance(app.screen, PlaygroundScreen) and app.screen.query("ChatColumn") and app.screen,
        what="the Playground screen",
    )


def record_pieces(monkeypatch) -> dict[str, list[str]]:
    """Column id -> its reply text after every `append_reply` (what the column showed, in order)."""
    from workbench.widgets.chat_column import ChatColumn

    seen: dict[str, list[str]] = {}
    original = ChatColumn.append_reply

    def spy(self, piece: str) -> None:
        original(self, piece)
        seen.setdefault(self.id, []).append(self.reply)

    monkeypatch.setattr(ChatColumn, "append_reply", spy)
    return seen


async def open_playground(pilot, models: list[str], *, max_tokens: str = "40"):
    pilot.app.push_screen(pilot.app.make_screen("playground", models=models))
    screen = await playground_shown(pilot)
    for i in range(len(models)):
        await wait_for(
            pilot,
            lambda i=i: screen.column(i).status.startswith("ready"),
            what=lambda i=i: f"model {i} loaded (status: {screen.column(i).status!r})",
        )
    screen.query_one("SamplingControls").set_values(max_tokens=max_tokens)
    return screen


async def send(pilot, screen, text: str) -> None:
    screen.query_one("#prompt").value = text
    screen.query_one("#prompt").focus()
    await pilot.press("enter")


def messages_of(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_reply_streams_into_the_column_and_equals_greedy_generation(
    chat_dirs, tunebench_home, monkeypatch
):
    seen = record_pieces(monkeypatch)
    expected = greedy(chat_dirs[0], QUESTION, 40)
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_playground(pilot, [str(chat_dirs[0])])
        col = screen.column(0)
        assert col.border_title == "model_a" and "chat template" in col.status
        assert not screen.column(1).display  # one model: one column
        await send(pilot, screen, QUESTION)
        await wait_for(
            pilot, lambda: col.messages and col.messages[-1]["role"] == "assistant", what="reply done"
        )
        shown = seen["chat-0"]
        assert len(shown) > 5  # the text appeared piece by piece ...
        assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(shown, shown[1:]))  # ... growing
        assert shown[-1] == expected and col.reply == expected  # ... into exactly the engine's greedy output
        assert col.messages == [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": expected},
        ]
        assert "40 tokens" in col.status and "ended by max tokens" in col.status
        # A second turn is built from the whole conversation (the template over both turns).
        await send(pilot, screen, "and three?")
        await wait_for(pilot, lambda: len(col.messages) == 4, what="second reply")
        assert col.messages[-1]["content"] and "ended by" in col.status


async def test_two_models_answer_side_by_side(chat_dirs, tunebench_home, monkeypatch):
    seen = record_pieces(monkeypatch)
    expected = [greedy(folder, QUESTION, 40) for folder in chat_dirs]
    assert expected[0] != expected[1]
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_playground(pilot, [str(d) for d in chat_dirs])
        cols = [screen.column(0), screen.column(1)]
        assert all(c.display for c in cols) and [c.border_title for c in cols] == ["model_a", "model_b"]
        assert cols[0].region.x < cols[1].region.x and cols[0].region.y == cols[1].region.y  # two columns
        await send(pilot, screen, QUESTION)
        await wait_for(pilot, lambda: not screen.streaming, what="both replies done")
        for i, col in enumerate(cols):
            assert len(seen[f"chat-{i}"]) > 5 and col.reply == expected[i]


async def test_leaving_the_screen_frees_the_models(chat_dirs, tunebench_home):
    from workbench.screens.runs_screen import RunsScreen

    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_playground(pilot, [str(d) for d in chat_dirs], max_tokens="8")
        await send(pilot, screen, QUESTION)
        await wait_for(pilot, lambda: not screen.streaming and screen.column(1).messages, what="replies")
        refs = [weakref.ref(screen.models[i].model) for i in range(2)]
        refs += [weakref.ref(screen.models[i]) for i in range(2)]
        assert all(r() is not None for r in refs)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen), what="back on Runs")
        await pilot.pause(0.2)
        gc.collect()
        assert [r() for r in refs] == [None] * 4


async def test_stop_key_ends_the_reply_mid_stream(chat_dirs, tunebench_home, monkeypatch):
    seen = record_pieces(monkeypatch)
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_playground(pilot, [str(chat_dirs[0])], max_tokens="200")
        model = screen.models[0].model
        step = model.forward_hidden

        def slow_step(*args, **kwargs):  # 30 ms a token: 200 tokens would take 6 s
            time.sleep(0.03)
            return step(*args, **kwargs)

        monkeypatch.setattr(model, "forward_hidden", slow_step)
        col = screen.column(0)
        await send(pilot, screen, QUESTION)
        await wait_for(pilot, lambda: len(seen.get("chat-0", [])) >= 5, what="some text streamed")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not col.streaming, timeout=30, what="the reply stopped")
        assert "ended by stop key" in col.status
        n = int(col.status.split()[0])  # "N tokens in ..."
        assert 5 <= n < 200  # stopped, not run to max tokens
        assert col.messages[-1] == {"role": "assistant", "content": col.reply}
    assert col.reply == greedy(chat_dirs[0], QUESTION, n)  # the first n tokens of the uninterrupted reply


async def test_bad_models_are_one_line(chat_dirs, tunebench_home, tmp_path):
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run

    with open_db() as db:
        run = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="no-ckpt")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a model")
    no_weights = shutil.copytree(chat_dirs[0], tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("playground", models=[str(tmp_path / "notes"), run.id]))
        screen = await playground_shown(pilot)
        await wait_for(pilot, lambda: len(messages_of(app)) >= 2, what="two notifications")
        texts = messages_of(app)
        assert any("notes: not a model" in t for t in texts), texts
        assert any("run no-ckpt has no checkpoint yet" in t and "no-ckpt@base" in t for t in texts), texts
        assert all("\n" not in t and "Traceback" not in t for t in texts)
        assert screen.models == {} and "not a model" in screen.column(0).status
        await send(pilot, screen, QUESTION)  # nothing to answer: a warning, no crash
        await wait_for(pilot, lambda: any("no model loaded" in t for t in messages_of(app)), what="warning")
        # Chosen with ctrl+l: a folder that does not exist, a model folder without its weights.
        for spec, says in (
            (str(tmp_path / "missing"), "missing: no such file or folder; give demo"),
            (str(no_weights), "no model.safetensors or model.safetensors.index.json found"),
        ):
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: app.screen.query("#text"), what="model prompt")
            app.screen.query_one("#text").value = spec
            await pilot.press("enter")
            col = screen.column(0)
            await wait_for(
                pilot,
                lambda col=col, says=says: says in col.status,
                what=lambda col=col, says=says: f"{says!r} in the status ({col.status!r})",
            )
            assert "\n" not in col.status and str(col.status).startswith(spec) and screen.models == {}
        assert all("\n" not in t and "Traceback" not in t for t in messages_of(app))


def _run_with_checkpoint(name: str, model_dir: Path, base: Path) -> str:
    """A finished run whose config starts from `base` and whose checkpoint step_3 holds `model_dir`."""
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run

    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text=f"checkpoint_dir: {base}\n", name=name)
    shutil.copytree(model_dir, Path(rec.output_dir) / "checkpoints" / "step_3" / "model")
    return rec.id


async def test_reached_from_runs_compare_and_f10(chat_dirs, tunebench_home, monkeypatch):
    from workbench.screens.compare_screen import CompareScreen
    from workbench.screens.playground import PlaygroundScreen
    from workbench.screens.runs_screen import RunsScreen
    from workbench.widgets.runs_table import RunsTable

    first = _run_with_checkpoint("tuned-a", chat_dirs[0], chat_dirs[1])
    second = _run_with_checkpoint("tuned-b", chat_dirs[1], chat_dirs[0])
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.rows_by_id) == 2, what="runs listed")
        table.focus()
        cursor_run = table.selected_ids()[0]
        await pilot.press("a")  # the run under the cursor: its latest checkpoint
        screen = await playground_shown(pilot)
        name = "tuned-a" if cursor_run == first else "tuned-b"
        await wait_for(pilot, lambda: screen.column(0).status.startswith("ready"), what="run model loaded")
        assert screen.column(0).border_title == f"{name} · step 3" and not screen.column(1).display
        # ctrl+r offers the run's base for the right column
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.screen.query("#text"), what="model prompt")
        assert app.screen.query_one("#text").value == f"{cursor_run}@base"
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: screen.column(1).status.startswith("ready"),
            what=lambda: f"base loaded ({screen.column(1).status})",
        )
        assert screen.column(1).border_title.startswith(f"base of {name} · model_")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))

        app.push_screen(app.make_screen("compare", run_ids=[first, second]))
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        await pilot.press("a")  # the compared runs side by side
        screen = await playground_shown(pilot)
        for i in range(2):
            await wait_for(pilot, lambda i=i: screen.column(i).status.startswith("ready"), what=f"column {i}")
        assert [screen.column(i).border_title for i in range(2)] == ["tuned-a · step 3", "tuned-b · step 3"]
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))

        loads = []  # f10 opens the demo model; its loading (a conversion on first use) is not this test's
        monkeypatch.setattr(PlaygroundScreen, "load_model", lambda self, column, spec: loads.append(spec))
        await pilot.press("f10")  # from anywhere
        await wait_for(pilot, lambda: isinstance(app.screen, PlaygroundScreen) and loads, what="f10")
        assert loads == ["demo"] and app.screen.column(0).status == "loading demo…"


def test_sampling_settings_reach_the_generation_and_bad_ones_are_one_line(chat_dirs):
    from engine.generation import generate
    from workbench.chat_models import ChatSource, load_chat_model, parse_settings
    from workbench.errors import UserError

    assert parse_settings("0.7", "0.9", "12") == SamplingSettings(
        temperature=0.7, top_p=0.9, max_new_tokens=12
    )
    assert parse_settings("0", "1", "5").top_p is None  # top-p 1: the whole distribution
    for args, says in (
        (("-1", "1", "5"), "temperature -1: must be >= 0"),
        (("x", "1", "5"), "temperature 'x': not a number"),
        (("0", "0", "5"), "top-p 0: must be in (0, 1]"),
        (("0", "1", "0"), "max tokens 0: must be at least 1"),
        (("0", "1", "2.5"), "max tokens '2.5': not a whole number"),
    ):
        with pytest.raises(UserError, match=re.escape(says)):
            parse_settings(*args)
    chat = load_chat_model(ChatSource("a", "a", str(chat_dirs[0])), device="cpu")
    messages = [{"role": "user", "content": QUESTION}]
    settings = SamplingSettings(temperature=1.3, top_p=0.8, max_new_tokens=16)
    pieces: list[str] = []
    reply = chat.reply(messages, settings, on_text=pieces.append, seed=3)
    ids = chat.prompt_ids(messages, 16)
    tok = chat.tokenizer
    out = generate(
        chat.model, [ids], max_new_tokens=16, temperature=1.3, top_p=0.8, seed=3, pad_id=tok.pad_id
    )
    assert reply.text == "".join(pieces) == tok.decode(out.completions[0], skip_special_tokens=True)
    greedy_text = chat.reply(messages, SamplingSettings(max_new_tokens=16), on_text=lambda p: None).text
    assert reply.text != greedy_text  # sampled at temperature 1.3, not greedy


def _hf_greedy(model, tok, question: str, n: int) -> str:
    """transformers' greedy `generate` for one user message with the chat template, decoded."""
    import torch

    ids = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    x = torch.tensor([ids])
    out = model.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, eos_token_id=None
    )
    return tok.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)


async def test_lora_run_and_its_base_side_by_side_equal_transformers_and_peft(chat_dirs, tunebench_home):
    """A LoRA run's checkpoint (PEFT adapters naming the base folder, as LoRA runs save) beside the run's
    base: each column's greedy reply equals transformers' (with peft's adapters for the run)."""
    import json

    import torch

    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from engine.data.tokenizers import load_tokenizer
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run

    base = chat_dirs[0]
    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text=f"checkpoint_dir: {base}\n", name="lora-run")
    adapters = Path(rec.output_dir) / "checkpoints" / "step_2" / "model"
    ref_base = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    lora = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
        peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
        ),
    )
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    lora.save_pretrained(adapters)
    cfg = json.loads((adapters / "adapter_config.json").read_text())
    (adapters / "adapter_config.json").write_text(json.dumps(dict(cfg, base_model_name_or_path=str(base))))
    tok = load_tokenizer(base)
    expected = [_hf_greedy(lora.eval(), tok, QUESTION, 24), _hf_greedy(ref_base, tok, QUESTION, 24)]
    assert expected[0] != expected[1]  # the adapters change the answer

    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_playground(pilot, ["lora-run", "lora-run@base"], max_tokens="24")
        titles = [screen.column(i).border_title for i in range(2)]
        assert titles == ["lora-run · step 2", "base of lora-run · model_a"]
        await send(pilot, screen, QUESTION)
        await wait_for(pilot, lambda: not screen.streaming and screen.column(1).messages, what="replies")
        assert [screen.column(i).reply for i in range(2)] == expected
