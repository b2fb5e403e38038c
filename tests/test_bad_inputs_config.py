"""Bad configs through the recipes and `tunebench validate`/`run`: each is one line on stderr naming the
field and what to change, exit code 2, no traceback, and nothing written (DESIGN.md, "Product interface").

The recipes run in this process (`recipe_main([...])`) with `engine.training.shutdown` replaced by an
exception carrying the exit code, so each case costs milliseconds: every one of these is refused by
`validate` before a model or dataset is built.
"""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import pytest

from engine.config import dump_config
from workbench.cli import main

pytestmark = pytest.mark.timeout(120)

TINY_MODEL = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64,
    "intermediate_dim": 128, "max_seq_len": 64,
}  # fmt: skip
SFT = {
    "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
    "model": TINY_MODEL,
    "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": "/nonexistent/tokenizer"},
    "dataset": {"_component_": "engine.data.instruct_dataset", "source": "/nonexistent/rows.json", "max_seq_len": 48},
    "batch_size": 4, "gradient_accumulation_steps": 1, "epochs": 1, "max_steps_per_epoch": 2,
    "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-3},
    "clip_grad_norm": None, "save_every_n_steps": None, "keep_last_n_checkpoints": 2,
}  # fmt: skip
DPO = {k: v for k, v in SFT.items() if k != "dataset"} | {
    "dataset": {"_component_": "engine.data.demo_preference_dataset", "n": 8, "max_seq_len": 80, "cache": False},
    "loss": {"_component_": "engine.modules.loss.DPOLoss", "beta": 0.1},
}  # fmt: skip
KD = SFT | {"teacher_model": TINY_MODEL, "teacher_checkpoint_dir": None}
GRPO = {
    "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
    "model": TINY_MODEL | {"vocab_size": 16},
    "tokenizer": {"_component_": "engine.rl.toy_task.DigitTokenizer"},
    "dataset": {"_component_": "engine.rl.toy_task.digit_successor_dataset", "n": 40, "seed": 0},
    "batch_size": 4, "group_size": 8, "max_new_tokens": 2, "temperature": 1.0,
    "rewards": {"correct": {"_component_": "engine.rl.toy_task.digit_successor_reward"}},
    "ppo_epochs": 1, "epochs": 1, "max_steps_per_epoch": 1,
    "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-2},
}  # fmt: skip
BASE = {"sft": SFT, "dpo": DPO, "kd": KD, "grpo": GRPO}


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _write(tmp_path: Path, recipe: str, cfg: dict) -> Path:
    path = tmp_path / f"{recipe}.yaml"
    path.write_text(f"# tunebench run {recipe} --config {path.name}\n" + dump_config(cfg))
    return path


def _config(recipe: str, tmp_path: Path, change: dict) -> dict:
    cfg = copy.deepcopy(BASE[recipe]) | {"output_dir": str(tmp_path / "out")}
    if recipe in ("sft", "kd"):  # paths that exist (the recipes check them before building anything)
        (tmp_path / "tokenizer").mkdir(exist_ok=True)
        (tmp_path / "rows.json").write_text("[]")
        cfg["tokenizer"]["path"] = str(tmp_path / "tokenizer")
        cfg["dataset"]["source"] = str(tmp_path / "rows.json")
    for key, value in change.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return cfg


_DELETE = object()


def run_recipe(monkeypatch, capsys, recipe: str, path: Path, *overrides: str) -> tuple[int, list[str], str]:
    """`python -m engine.recipes.<recipe> --config path overrides` in this process: (code, lines, err)."""
    import engine.training

    def _shutdown(code: int = 0):
        raise _Exited(code)

    monkeypatch.setattr(engine.training, "shutdown", _shutdown)
    module = importlib.import_module(f"engine.recipes.{recipe}")
    capsys.readouterr()
    with pytest.raises(_Exited) as info:
        module.recipe_main(["--config", str(path), *overrides])
    err = capsys.readouterr().err
    return info.value.code, err.strip().splitlines(), err


# (recipe, change, the words the one line must hold). Each of these was a traceback (ValueError,
# KeyError, AttributeError from int()/dict()/cfg[...]) or silently ran with the wrong meaning
# (`optimizer_in_bwd: "no"` is True to bool(); `batch_size: 2.5` trained with 2; `save_every_n_steps: 0`
# never saved) before the recipes declared their CONFIG_SCHEMA.
CASES = [
    ("sft", {"batch_size": "two"}, "batch_size: expects an integer >= 1, got str 'two'"),
    ("sft", {"batch_size": 2.5}, "batch_size: expects an integer >= 1, got float 2.5"),
    ("sft", {"seed": "abc"}, "seed: expects an integer, got str 'abc'"),
    ("sft", {"max_steps_per_epoch": "abc"}, "max_steps_per_epoch: expects an integer >= 1 or null"),
    ("sft", {"max_steps_per_epoch": -1}, "max_steps_per_epoch: expects an integer >= 1 or null, got int -1"),
    ("sft", {"clip_grad_norm": "abc"}, "clip_grad_norm: expects a number > 0 or null"),
    ("sft", {"save_every_n_steps": 0}, "save_every_n_steps: expects an integer >= 1 or null, got int 0"),
    ("sft", {"optimizer_in_bwd": "no"}, "optimizer_in_bwd: expects true or false, got str 'no'"),
    ("sft", {"num_workers": -1}, "num_workers: expects an integer >= 0, got int -1"),
    ("sft", {"validation": "yes"}, "validation: expects a mapping or null, got str 'yes'"),
    ("sft", {"validation": {"fractoin": 0.1}}, "validation.fractoin: unknown key under validation (did you mean 'fraction'?)"),
    ("sft", {"fsdp": "yes"}, "fsdp: expects a mapping or null, got str 'yes'"),
    ("sft", {"model": _DELETE}, "model: missing — add `model:` with a mapping with _component_"),
    ("sft", {"dataset": _DELETE}, "dataset: missing"),
    ("sft", {"model": "llama"}, "model: expects a mapping with _component_, got str 'llama'"),
    ("sft", {"dtype": "fp8"}, "dtype: expects fp32 or bf16, got str 'fp8'"),
    ("sft", {"device": "gpu"}, "device: expects cpu, cuda, cuda:N or auto, got str 'gpu'"),
    ("sft", {"gradient_accumulation_steps": 0}, "gradient_accumulation_steps: expects an integer >= 1, got int 0"),
    ("dpo", {"batch_size": "two"}, "batch_size: expects an integer >= 1, got str 'two'"),
    ("kd", {"seed": "abc"}, "seed: expects an integer, got str 'abc'"),
    ("grpo", {"group_size": "two"}, "group_size: expects an integer >= 1, got str 'two'"),
    ("grpo", {"rewards": ["x"]}, "rewards: expects a mapping or null, got list ['x']"),
    ("grpo", {"rewards": {"x": 5}}, "rewards.x: expects a mapping with _component_, got int 5"),
    ("grpo", {"minibatch_size": 5}, "minibatch_size: 5 does not divide batch_size * group_size = 32 — use a divisor"),
    ("grpo", {"reward_weights": {"correct": "high"}},
     "reward_weights: expects a mapping of reward name to number, or null, got dict {'correct': 'high'}"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("recipe", "change", "needle"), CASES, ids=[f"{r}-{next(iter(c))}" for r, c, _ in CASES]
)
def test_recipe_refuses_a_bad_value_in_one_line(recipe, change, needle, tmp_path, monkeypatch, capsys):
    path = _write(tmp_path, recipe, _config(recipe, tmp_path, change))
    code, lines, err = run_recipe(monkeypatch, capsys, recipe, path)
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{recipe}: ") and needle in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # nothing written


# Everything but the minibatch_size case (which needs the group size the recipe works out) is static.
VALIDATED = CASES[:6] + [c for c in CASES if c[0] != "sft" and "minibatch_size" not in c[1]]


@pytest.mark.parametrize(("recipe", "change", "needle"), VALIDATED)
def test_validate_finds_it_without_running(recipe, change, needle, tmp_path, capsys):
    path = _write(tmp_path, recipe, _config(recipe, tmp_path, change))
    capsys.readouterr()
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr().out
    assert needle in out and "Traceback" not in out, out


def test_validate_reports_every_bad_value_at_once(tmp_path, capsys):
    cfg = _config("sft", tmp_path, {"batch_size": "two", "epochs": -1, "dtype": "fp8"})
    path = _write(tmp_path, "sft", cfg)
    capsys.readouterr()
    assert main(["validate", str(path), "optimizer_in_bwd=maybe"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert sorted(line.split(":")[0] for line in out[:-1]) == [
        "batch_size",
        "dtype",
        "epochs",
        "optimizer_in_bwd",
    ]
    assert out[-1] == f"4 problems in {path}"


def test_the_builtin_configs_still_validate(capsys):
    for name in (
        "demo/smollm2_135m_lora",
        "demo/smollm2_135m_lora_dpo",
        "llama3_2/1B_kd",
        "qwen2_5/0.5B_lora_grpo",
    ):
        assert main(["validate", name]) == 0, capsys.readouterr().out


def test_tunebench_run_with_a_bad_value_registers_nothing(tunebench_home, tmp_path, capsys):
    path = _write(tmp_path, "sft", _config("sft", tmp_path, {}))
    capsys.readouterr()
    assert main(["run", "sft", "--config", str(path), "batch_size=two", "--detach"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batch_size: expects an integer >= 1, got str 'two'" in err[0], err
    runs = tunebench_home / "runs"
    assert not runs.exists() or not list(runs.iterdir())


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_output_dir_that_cannot_be_a_folder_is_named_before_anything_is_built(
    where, tmp_path, monkeypatch, capsys
):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine\n")
    out = blocker if where == "file" else blocker / "run"
    path = _write(tmp_path, "sft", _config("sft", tmp_path, {"output_dir": str(out)}))
    code, lines, err = run_recipe(monkeypatch, capsys, "sft", path)  # was a NotADirectoryError traceback
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"sft: output_dir: {blocker} is a file") and "choose a folder" in lines[0]
    assert blocker.read_text() == "mine\n"


def test_a_tokenizer_larger_than_the_model_vocabulary_is_one_line(tmp_path, monkeypatch, capsys):
    """Was `IndexError: index out of range in self` from torch.embedding at the first step."""
    cfg = _config("grpo", tmp_path, {"model.vocab_size": 8})
    code, lines, err = run_recipe(monkeypatch, capsys, "grpo", _write(tmp_path, "grpo", cfg))
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == (
        "grpo: model.vocab_size: the model has 8 token embeddings but the tokenizer has 16 tokens "
        "— use the model's own tokenizer, or set model.vocab_size to at least 16"
    )
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_kd_names_the_teacher_checkpoint_dir_when_it_is_missing(tmp_path, monkeypatch, capsys):
    """Was reported as `checkpoint_dir`, the student's key, after the student was built."""
    cfg = _config("kd", tmp_path, {"teacher_checkpoint_dir": str(tmp_path / "no-teacher")})
    code, lines, err = run_recipe(monkeypatch, capsys, "kd", _write(tmp_path, "kd", cfg))
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"kd: teacher_checkpoint_dir: {tmp_path / 'no-teacher'} is not a model folder")


def _saved_checkpoint(tmp_path: Path, intermediate_dim: int = 32):
    import torch

    from engine.checkpoint.recipe_state import save_checkpoint
    from engine.models.llama3 import llama3

    def build(dim: int):
        torch.manual_seed(0)
        model = llama3(vocab_size=16, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16,
                       intermediate_dim=dim, max_seq_len=8)  # fmt: skip
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    model, opt = build(intermediate_dim)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, recipe_state={"epoch": 0}, keep_last=1)
    return path, build


def test_resuming_with_another_model_or_optimizer_is_one_line(tmp_path):
    """DCP raises a `CheckpointException`, a BaseException that used to escape as a 40-line traceback."""
    import torch

    from engine.checkpoint.recipe_state import CheckpointStateError, load_checkpoint

    path, build = _saved_checkpoint(tmp_path)
    model, opt = build(24)
    with pytest.raises(CheckpointStateError) as info:
        load_checkpoint(path, model=model, optimizer=opt)
    msg = str(info.value)
    assert msg.startswith(f"{path}: cannot load the recipe checkpoint (Size mismatch between saved")
    assert msg.endswith(
        "resume with the config this checkpoint was saved with, or set resume=false to start over"
    )
    assert "\n" not in msg and "Traceback" not in msg
    model, _ = build(32)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointStateError, match=r"Missing key in checkpoint state_dict: optim\."):
        load_checkpoint(path, model=model, optimizer=sgd)


def test_a_damaged_recipe_state_file_is_named_briefly(tmp_path):
    from engine.checkpoint.recipe_state import CheckpointStateError, load_checkpoint

    path, build = _saved_checkpoint(tmp_path)
    (path / "recipe_state.pt").write_bytes(b"xx")
    model, opt = build(32)
    with pytest.raises(CheckpointStateError) as info:
        load_checkpoint(path, model=model, optimizer=opt)
    assert str(info.value) == (
        f"{path}: cannot load the recipe checkpoint (a file in it is damaged or not a torch file); "
        "resume from an older checkpoints/step_<N> folder or start a new run with the same config"
    )  # was torch.load's paragraph about weights_only


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["run", "sft", "--config", "x.yaml", "--nproc", "abc"],
         "tunebench run: argument --nproc: invalid int value: 'abc' — see `tunebench run --help`"),
        (["runs", "--bogus"], "tunebench runs: unrecognized arguments: --bogus — see `tunebench runs --help`"),
        (["generate", "demo", "--prompt", "hi"],
         "tunebench generate: unrecognized arguments: --prompt — see `tunebench generate --help`"),
        (["eval", "demo", "--tasks", "arith_mc", "--limit", "abc"],
         "tunebench eval: argument --limit: invalid float value: 'abc' — see `tunebench eval --help`"),
    ],
)  # fmt: skip
def test_a_malformed_command_line_is_one_line_not_the_usage_block(argv, line, tunebench_home, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_a_recipe_started_without_config_says_so_in_one_line(capsys):
    from engine.recipes import sft

    with pytest.raises(SystemExit) as info:
        sft.recipe_main([])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "python -m engine.recipes.sft: the following arguments are required: --config"
        " — see `python -m engine.recipes.sft --help`"
    ]


def test_a_builder_refusing_a_value_names_its_node_once(tmp_path, monkeypatch, capsys):
    """Was `engine.models.llama3.llama3: engine.models.llama3.llama3(...) refused ... under engine...`."""
    # (a size of 0 is refused up front by validate now: engine.config.argument_bounds; this one is the
    # builder's own check between two values)
    path = _write(tmp_path, "sft", _config("sft", tmp_path, {"model.num_heads": 3}))
    code, lines, err = run_recipe(monkeypatch, capsys, "sft", path)
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == (
        "sft: engine.models.llama3.llama3(...) refused its arguments: embed_dim (64) must be a multiple of"
        " num_heads (3), or set head_dim — fix that value in the node with _component_: engine.models.llama3.llama3"
    )


def test_dataset_max_seq_len_says_it_is_the_datasets(shared_assets, tmp_path):
    from engine.data.builders import instruct_dataset
    from engine.data.data_errors import DataError
    from engine.data.tokenizers import load_tokenizer

    tok = load_tokenizer(path=str(shared_assets / "tokenizers" / "smollm2"))
    rows = shared_assets / "data" / "alpaca_data_cleaned_1000.json"
    with pytest.raises(
        DataError, match=r"^max_seq_len \(of the dataset\): must be an integer >= 2, got 0; set it"
    ):
        instruct_dataset(tok, source=str(rows), max_seq_len=0, cache=False)


@pytest.mark.parametrize(
    ("recipe", "overrides", "needle"),
    [
        ("sft", ["optimizer_in_bwd=true", "gradient_accumulation_steps=2"],
         "gradient_accumulation_steps: 2 cannot be used with optimizer_in_bwd=True"),
        ("sft", ["optimizer_in_bwd=true", "clip_grad_norm=1.0"],
         "clip_grad_norm: 1.0 cannot be used with optimizer_in_bwd=True"),
        ("sft", ["validation.fraction=1.5"], "validation.fraction: expects a number > 0 and < 1, got float 1.5"),
        ("grpo", ["top_p=2.0"], "top_p: expects a number > 0 and <= 1 or null, got float 2.0"),
    ],
)  # fmt: skip
def test_validate_finds_values_that_only_conflict_at_run_time(recipe, overrides, needle, tmp_path, capsys):
    """These were reported only once the run had built its model (or, for top_p, sampled)."""
    path = _write(tmp_path, recipe, _config(recipe, tmp_path, {}))
    capsys.readouterr()
    assert main(["validate", str(path), *overrides]) == 2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith(needle) and out[1] == f"1 problem in {path}", out


EVAL = {"model_dir": "demo", "tasks": ["arith_mc"], "limit": 2}


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"seed": "abc"}, "eval: seed: expects an integer or null, got str 'abc'"),  # a traceback after scoring
        ({"apply_chat_template": "no"}, "eval: apply_chat_template: expects true or false or null, got str 'no'"),
        ({"device": "gpu"}, "eval: device: expects cpu, cuda, cuda:N or auto, got str 'gpu'"),  # RuntimeError
        ({"task_dirs": "/tmp/tasks"}, "eval: task_dirs: expects a list of str or null, got str '/tmp/tasks'"),
    ],
)  # fmt: skip
def test_eval_recipe_refuses_bad_values_before_loading_anything(change, line, tmp_path, capsys):
    from engine.recipes import eval as eval_recipe

    path = tmp_path / "eval.yaml"
    path.write_text("# tunebench run eval --config eval.yaml\n" + dump_config(EVAL | change))
    capsys.readouterr()
    assert eval_recipe.recipe_main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err


def test_eval_output_dir_and_run_are_checked_before_scoring(tunebench_home, tmp_path, capsys, monkeypatch):
    """Both used to fail only after the whole evaluation had run (NotADirectoryError traceback)."""
    from engine.recipes import eval as eval_recipe

    def no_scoring(*args, **kwargs):
        raise AssertionError("the evaluation ran before the bad input was reported")

    monkeypatch.setattr("engine.eval.evaluate", no_scoring)
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine\n")
    path = tmp_path / "eval.yaml"
    path.write_text(dump_config(EVAL | {"output_dir": str(blocker)}))
    capsys.readouterr()
    assert eval_recipe.recipe_main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"eval: output_dir: {blocker} is a file — choose a folder for output_dir"
    ]
    path.write_text(dump_config(EVAL | {"run": "no-such-run"}))
    assert eval_recipe.recipe_main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eval: run: 'no-such-run' is not a tracker run ("), err
    assert err[0].endswith("— set run to one from `tunebench runs`, or null")


@pytest.mark.parametrize("override", ["dataset.0.source=x", "~dataset.0"])
def test_an_override_indexing_a_mapping_says_it_is_not_a_list(override, tmp_path, capsys):
    """`dataset.0.source=x` on a single dataset used to add a key `0` (then 'unknown argument 0')."""
    path = _write(tmp_path, "sft", _config("sft", tmp_path, {}))
    capsys.readouterr()
    assert main(["validate", str(path), override]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"override {override!r}: dataset is a mapping, not a list, so it has no item 0"
        " — use one of its keys (_component_, source, max_seq_len)"
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_data_file_that_is_not_utf8_names_the_file(suffix, tmp_path):
    """Was a UnicodeDecodeError from pyarrow, reported as the builder refusing its arguments."""
    from engine.data.data_errors import DataError
    from engine.data.sources import load_rows

    path = tmp_path / f"rows{suffix}"
    path.write_bytes('{"instruction": "café", "input": "", "output": "b"}\n'.encode("latin-1"))
    with pytest.raises(DataError) as info:
        load_rows(path)
    assert str(info.value).startswith(f"source '{path}': is not UTF-8 text")
    assert str(info.value).endswith("save the file as UTF-8")


def test_resume_true_without_a_checkpoint_says_it_starts_over(tmp_path, monkeypatch, capsys):
    """`resume: true` on an empty output_dir trains from step 0 (a run killed before its first
    checkpoint restarts that way); it used to do so without a word."""
    import engine.training
    from engine.recipes import grpo

    def _shutdown(code: int = 0):
        raise _Exited(code)

    monkeypatch.setattr(engine.training, "shutdown", _shutdown)
    cfg = _config("grpo", tmp_path, {"resume": True, "num_samples_to_log": 0})
    path = _write(tmp_path, "grpo", cfg)
    capsys.readouterr()
    with pytest.raises(_Exited) as info:
        grpo.recipe_main(["--config", str(path)])
    captured = capsys.readouterr()
    assert info.value.code == 0, captured.err
    notice = f"no checkpoint under {tmp_path / 'out'}/checkpoints yet: starting at step 0"
    assert notice in captured.out + captured.err
    assert (tmp_path / "out" / "checkpoints" / "step_1").is_dir()


def test_a_component_of_the_wrong_kind_is_named_once(tmp_path, monkeypatch, capsys):
    """A tokenizer class given as a reward function: the recipe's call-site arguments do not fit."""
    cfg = _config("grpo", tmp_path, {"rewards": {"x": {"_component_": "engine.rl.toy_task.DigitTokenizer"}}})
    code, lines, err = run_recipe(monkeypatch, capsys, "grpo", _write(tmp_path, "grpo", cfg))
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("grpo: engine.rl.toy_task.DigitTokenizer cannot take these arguments (")
    assert lines[0].endswith(
        "or check that engine.rl.toy_task.DigitTokenizer is the right kind of component here"
    )


def _one_line_exit_2(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_tunebench_eval_bad_inputs_are_one_line(tunebench_home, tmp_path, capsys):
    from engine.tracking import open_db
    from engine.tracking.run_rows import create_run, update_run

    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="done")
        update_run(rec.id, db=db, status="completed", exit_code=0)
    line = _one_line_exit_2(capsys, ["eval", "done", "--tasks", "arith_mc"])
    assert line.startswith("tunebench: run done (completed) saved no checkpoint under ")  # was "wait for one"
    line = _one_line_exit_2(
        capsys, ["eval", "demo", "--tasks", "arith_mc", "--task-dir", str(tmp_path / "no")]
    )
    assert (
        line
        == f"tunebench: --task-dir {tmp_path / 'no'}: no such folder; give a folder of lm-eval task YAMLs"
    )
    line = _one_line_exit_2(capsys, ["eval", "demo", "--tasks", "arith_mc", "--device", "gpu"])
    assert line.startswith("tunebench: device: expects cpu, cuda, cuda:N or auto, got str 'gpu'")  # alone now


def test_samples_longer_than_the_model_are_one_line(shared_assets, tmp_path, monkeypatch, capsys):
    """Was `IndexError: index 16 is out of bounds` from the rotary table at the first step."""
    cfg = _config("sft", tmp_path, {"model.max_seq_len": 16, "model.vocab_size": 49152})
    cfg["tokenizer"]["path"] = str(shared_assets / "tokenizers" / "smollm2")
    cfg["dataset"] |= {"source": str(shared_assets / "data" / "alpaca_data_cleaned_1000.json"),
                       "template": "engine.data.AlpacaInstructTemplate", "cache": False}  # fmt: skip
    code, lines, err = run_recipe(monkeypatch, capsys, "sft", _write(tmp_path, "sft", cfg))
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == (
        "sft: dataset.max_seq_len: samples are up to 48 tokens but model.max_seq_len is 16 — set the "
        "dataset's max_seq_len to 16 or less (or raise model.max_seq_len)"
    )
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_source_whose_rows_are_all_bad_is_one_line_without_the_skip_warning(
    shared_assets, tmp_path, caplog
):
    import json

    from engine.data.builders import chat_dataset
    from engine.data.data_errors import DataError
    from engine.data.tokenizers import load_tokenizer

    rows = tmp_path / "chats.jsonl"
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}
    rows.write_text("\n".join(json.dumps(bad) for _ in range(3)) + "\n")
    tok = load_tokenizer(path=str(shared_assets / "tokenizers" / "smollm2"))
    with pytest.raises(DataError) as info:
        chat_dataset(
            tok, source=str(rows), skip_bad_rows=True, chat_format="engine.data.ChatMLFormat", cache=False
        )
    assert str(info.value).startswith(f"source '{rows}': no usable rows out of 3 (3 bad, 0 filtered)")
    assert str(info.value).endswith("fix the rows, or the column_map/template/filter that rejects them")
    assert "skipped" not in caplog.text  # the warning used to come first, a second line on stderr


def test_a_lora_adapter_folder_as_checkpoint_dir_says_what_it_is(tmp_path, monkeypatch, capsys):
    adapters = tmp_path / "step_4" / "model"
    adapters.mkdir(parents=True)
    (adapters / "adapter_config.json").write_text('{"base_model_name_or_path": "/models/base"}')
    cfg = _config("sft", tmp_path, {"checkpoint_dir": str(adapters)})
    code, lines, err = run_recipe(monkeypatch, capsys, "sft", _write(tmp_path, "sft", cfg))
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"sft: checkpoint_dir: {adapters} holds LoRA adapters (adapter_config.json)")
    assert "point checkpoint_dir at the base model folder" in lines[0]


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"dataset.source": "{tmp}/typo.jsonl"}, "sft: dataset.source: {tmp}/typo.jsonl: no such file or folder"),
        ({"dataset": [{"_component_": "engine.data.instruct_dataset", "source": "{tmp}/rows.json"},
                      {"_component_": "engine.data.instruct_dataset", "source": "{tmp}/b.csv"}]},
         "sft: dataset.1.source: {tmp}/b.csv: no such file or folder"),
        ({"validation": {"dataset": {"_component_": "engine.data.instruct_dataset", "source": "./no/val.json"}}},
         "sft: validation.dataset.source: ./no/val.json: no such file or folder"),
        ({"tokenizer.path": "{tmp}/tok"}, "sft: tokenizer.path: {tmp}/tok: no such file or folder"),
    ],
)  # fmt: skip
def test_missing_local_files_are_named_before_the_model_is_loaded(
    change, line, tmp_path, monkeypatch, capsys
):
    """A typo'd dataset or tokenizer path used to surface only after the model was built and its
    weights loaded (minutes for a large model); a Hub dataset name is left to the loader."""
    import json

    change = json.loads(json.dumps(change).replace("{tmp}", str(tmp_path)))
    path = _write(tmp_path, "sft", _config("sft", tmp_path, change))
    built = []
    monkeypatch.setattr("engine.recipes.sft.SFTRecipe.setup", lambda self: built.append(1))
    code, lines, err = run_recipe(monkeypatch, capsys, "sft", path)
    assert code == 2 and len(lines) == 1 and not built, err
    assert lines[0].startswith(line.replace("{tmp}", str(tmp_path))), lines[0]


def test_kd_samples_longer_than_the_teacher_name_the_teacher(shared_assets, tmp_path, monkeypatch, capsys):
    cfg = _config("kd", tmp_path, {"model.vocab_size": 49152})
    cfg["teacher_model"] = dict(cfg["model"], max_seq_len=16)
    cfg["tokenizer"]["path"] = str(shared_assets / "tokenizers" / "smollm2")
    cfg["dataset"] |= {"source": str(shared_assets / "data" / "alpaca_data_cleaned_1000.json"),
                       "template": "engine.data.AlpacaInstructTemplate", "cache": False}  # fmt: skip
    code, lines, err = run_recipe(monkeypatch, capsys, "kd", _write(tmp_path, "kd", cfg))
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(
        "kd: dataset.max_seq_len: samples are up to 48 tokens but teacher_model.max_seq_len"
    )


def test_dpo_accumulation_longer_than_an_epoch_says_what_to_lower(
    tmp_path, monkeypatch, capsys, shared_assets
):
    cfg = _config(
        "dpo",
        tmp_path,
        {"gradient_accumulation_steps": 4, "model.vocab_size": 49152, "model.max_seq_len": 128},
    )
    cfg["tokenizer"]["path"] = str(shared_assets / "tokenizers" / "smollm2")
    code, lines, err = run_recipe(monkeypatch, capsys, "dpo", _write(tmp_path, "dpo", cfg))
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == (
        "dpo: gradient_accumulation_steps: 4 micro-batches exceed an epoch of 2 — lower it or the batch size, "
        "or use more pairs"
    )


def test_recipes_take_a_builtin_config_name_as_their_help_says(monkeypatch, capsys):
    """`--config demo/smollm2_135m_lora` was 'no such config file' outside the repository's root."""
    code, lines, err = run_recipe(
        monkeypatch, capsys, "sft", Path("demo/smollm2_135m_lora"), "max_steps_per_epoch=0"
    )
    assert code == 2 and lines == [
        "sft: max_steps_per_epoch: expects an integer >= 1 or null, got int 0 — change it to an integer >= 1 or null"
    ], err
    code, lines, err = run_recipe(monkeypatch, capsys, "sft", Path("demo/smollm2_135m_lorra"))
    assert code == 2 and len(lines) == 1 and "(did you mean 'demo/smollm2_135m_lora'?)" in lines[0], err


@pytest.mark.parametrize(
    ("text", "tail"),
    [
        ("seed: 0\nmodel:\n\t_component_: x\n",
         ":3:1: malformed YAML: found character '\\t' that cannot start any token — indent with spaces: YAML does not "
         "allow tabs"),
        ('seed: "abc\nepochs: 1\n',
         ":3:1: malformed YAML: found unexpected end of stream (while scanning a quoted scalar that starts at line 1, "
         "column 7) — close the quote opened at line 1, column 7"),  # was only 'end of stream' at 3:1
    ],
)  # fmt: skip
def test_malformed_yaml_points_at_what_to_fix(text, tail, tmp_path, monkeypatch, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    code, lines, err = run_recipe(monkeypatch, capsys, "sft", path)
    assert code == 2 and lines == [f"sft: {path}{tail}"], err


@pytest.mark.parametrize(
    ("recipe", "argv", "line"),
    [
        ("grpo", ["--nproc", "2"], "tunebench: --nproc 2: the grpo recipe runs on at most 1 process(es); use --nproc 1"),
        ("sft", ["--nproc", "3", "tensor_parallel_dim=2"],
         "tunebench: --nproc 3: tensor_parallel_dim: data_parallel_replicate_dim=1 x data_parallel_shard_dim=-1 x "
         "context_parallel_dim=1 x tensor_parallel_dim=2 needs a multiple of 2 ranks, but the run has 3 — choose "
         "degrees whose product divides the number of processes"),
    ],
)  # fmt: skip
def test_a_process_count_the_recipe_cannot_use_registers_nothing(
    recipe, argv, line, tunebench_home, tmp_path, capsys
):
    """Both used to start torchrun, register a run and fail it from inside every rank."""
    path = _write(tmp_path, recipe, _config(recipe, tmp_path, {}))
    capsys.readouterr()
    assert main(["run", recipe, "--config", str(path), *argv, "--detach"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    runs = tunebench_home / "runs"
    assert not runs.exists() or not list(runs.iterdir())


def test_output_piped_into_a_closed_reader_is_not_a_traceback(tmp_path):
    """`tunebench ls | head -1` printed a BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TUNEBENCH_HOME=str(tmp_path / "home"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "ls"],
        cwd=Path(__file__).resolve().parent.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err, err


def test_eval_model_dir_that_does_not_exist_names_the_field(tmp_path, capsys):
    from engine.recipes import eval as eval_recipe

    path = tmp_path / "eval.yaml"
    path.write_text(dump_config(EVAL | {"model_dir": str(tmp_path / "gone")}))
    capsys.readouterr()
    assert eval_recipe.recipe_main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"eval: model_dir: {tmp_path / 'gone'} is not a model folder (no such folder) — point it at a Hugging Face"
        " model folder, a run's checkpoints/step_<N>/model, or demo"
    ]
