"""Bad inputs through the public CLI: each gets one line on stderr naming the field or file and what to
change, exit code 2, no traceback, and nothing lost or half-written (DESIGN.md, "Product interface")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.data.data_errors import DataError
from engine.data.sources import load_rows
from engine.tracking import open_db
from engine.tracking.run_rows import create_run, update_run
from workbench.cli import main

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


def _one_line_exit_2(capsys, argv: list[str], *needles: str) -> str:
    """Runs `tunebench argv`; asserts exit 2, one `tunebench:` line on stderr holding every needle."""
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tunebench: ") and "Traceback" not in captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return captured.out


@pytest.fixture
def finished_run(tunebench_home) -> str:
    """A completed run in the tracker (no process), named `done`."""
    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="seed: 0\nlr: 0.1\n", name="done")
        update_run(rec.id, db=db, status="completed", exit_code=0)
    return "done"


def test_export_refuses_to_replace_an_existing_file_without_force(finished_run, capsys, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("my own notes\n")
    _one_line_exit_2(capsys, ["export", finished_run, "-o", str(mine)], str(mine), "--force")
    assert mine.read_text() == "my own notes\n"  # nothing lost
    assert main(["export", finished_run, "-o", str(mine), "--force"]) == 0
    assert "lr: 0.1" in mine.read_text()


def test_stop_of_a_finished_or_unknown_run_says_only_why(finished_run, capsys):
    out = _one_line_exit_2(capsys, ["stop", finished_run], "done is completed", "nothing to stop")
    assert "stopping" not in out
    out = _one_line_exit_2(capsys, ["stop", "no-such-run"], "'no-such-run'", "tunebench runs")
    assert "stopping" not in out


def test_empty_and_malformed_dataset_files_name_the_file_and_the_problem(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(
        DataError, match=r"empty\.jsonl'?: the file is empty; give a file with at least one row"
    ):
        load_rows(empty)
    no_rows = tmp_path / "rows.json"
    no_rows.write_text("[]")
    with pytest.raises(DataError, match=r"rows\.json'?: holds no rows"):
        load_rows(no_rows)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"instruction": "a", "input": "", "output": "b"}) + "\n{broken\n")
    with pytest.raises(DataError) as info:
        load_rows(broken)
    msg = str(info.value)
    assert "broken.jsonl" in msg and "row 1" in msg and "fix the file's format" in msg and "Hub" not in msg
    assert "\n" not in msg


@pytest.mark.distributed
def test_run_on_an_empty_dataset_fails_with_one_clear_line(tunebench_home, shared_assets, tmp_path):
    """End to end: `tunebench run sft` on an empty jsonl exits 2 and the run's error line names the file."""
    import yaml

    sys.path.insert(0, str(REPO / "tests" / "engine" / "recipes"))
    from _sft_helpers import tiny_config

    cfg = tiny_config(shared_assets, tmp_path / "unused", max_steps_per_epoch=1)
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    cfg["dataset"]["source"] = str(data)
    cfg.pop("output_dir")
    path = tmp_path / "tiny.yaml"
    path.write_text("# tunebench run sft --config tiny.yaml\n" + yaml.safe_dump(cfg, sort_keys=False))
    env = dict(os.environ, TUNEBENCH_HOME=str(tunebench_home))
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "run", "sft", "--config", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "StopIteration" not in proc.stderr
    line = f"sft: source '{data}': the file is empty; give a file with at least one row"
    assert line in proc.stderr
    with open_db() as db:
        (run,) = db.execute("SELECT status, exit_code, error FROM runs").fetchall()
    assert tuple(run) == ("failed", 2, line)  # the run's record holds just that line


def test_a_bad_input_failure_records_only_the_recipes_error_line():
    """Exit code 2: import warnings printed before the recipe's one line are not part of the run's
    error; a crash (exit code 1) keeps its traceback lines."""
    from workbench.supervisor import failure_summary

    tail = (
        "== tunebench: run sft-1 ==\n"
        "Failed to load /venv/torchao/_C_mxfp8.so: Could not load this library\n"
        "[rank0]:W1129 22:21:14.098000 26652 torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum\n"
        "sft: /runs/x/checkpoints/step_2: cannot load the recipe checkpoint (truncated); resume from an older one\n"
    )
    assert failure_summary(tail, 2) == (
        "sft: /runs/x/checkpoints/step_2: cannot load the recipe checkpoint (truncated); resume from an older one"
    )
    crash = (
        tail
        + 'Traceback (most recent call last):\n  File "x.py", line 1\nZeroDivisionError: division by zero\n'
    )
    summary = failure_summary(crash, 1)
    assert "ZeroDivisionError" in summary and "Failed to load" in summary
    assert failure_summary("", 3) == "exit code 3"


@pytest.mark.parametrize(
    "argv", [["runs"], ["show", "x"], ["run", "sft", "--config", "demo/smollm2_135m_lora"]]
)
def test_tunebench_home_that_is_a_file_is_named(argv, capsys, tmp_path, monkeypatch):
    home = tmp_path / "home.txt"
    home.write_text("not a folder\n")
    monkeypatch.setenv("TUNEBENCH_HOME", str(home))
    _one_line_exit_2(capsys, argv, f"TUNEBENCH_HOME={home} is a file", "point TUNEBENCH_HOME at a folder")
    assert home.read_text() == "not a folder\n"


def test_tunebench_home_under_a_file_is_named(capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TUNEBENCH_HOME", str(blocker / "home"))
    _one_line_exit_2(
        capsys,
        ["run", "sft", "--config", "demo/smollm2_135m_lora"],
        "cannot create this folder",
        "TUNEBENCH_HOME",
    )


@pytest.mark.parametrize("tag", ["", "a,b", "two words"])
def test_a_tag_that_would_not_come_back_as_given_is_refused(tag, tunebench_home, capsys):
    _one_line_exit_2(
        capsys, ["run", "sft", "--config", "demo/smollm2_135m_lora", "--tag", tag, "--detach"], f"tag {tag!r}"
    )
    assert not list((tunebench_home / "runs").iterdir())  # nothing half-written


def test_empty_compressed_file_and_a_column_map_that_is_not_a_mapping(shared_assets, tmp_path):
    import gzip

    from engine.data.builders import instruct_dataset
    from engine.data.tokenizers import load_tokenizer

    empty = tmp_path / "rows.jsonl.gz"
    with gzip.open(empty, "wb") as f:
        f.write(b"\n")
    with pytest.raises(DataError, match=r"rows\.jsonl\.gz'?: the file is empty"):
        load_rows(empty)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"instruction": "a", "input": "", "output": "b"}) + "\n")
    tok = load_tokenizer(path=str(shared_assets / "tokenizers" / "smollm2"))
    for bad in (["output"], {"output": 3}):
        with pytest.raises(DataError, match=r"^column_map: must map expected column -> your column"):
            instruct_dataset(tok, source=str(good), column_map=bad, cache=False)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"num_kv_heads": 0}, "num_kv_heads: must be a positive integer, got 0"),  # was ZeroDivisionError
        ({"num_layers": "2"}, "num_layers: must be a positive integer, got '2'"),  # was TypeError
        ({"embed_dim": -1}, "embed_dim: must be a positive integer, got -1"),  # was RuntimeError
        ({"num_heads": 3, "num_kv_heads": 1}, "embed_dim (64) must be a multiple of num_heads (3)"),
        ({"lora_attn_modules": "q_proj"}, "lora_attn_modules: give a list such as [q_proj, v_proj]"),
        ({"lora_rank": 0}, "lora_rank: must be a positive integer, got 0"),
    ],
)
def test_model_sizes_that_cannot_build_a_model_are_one_config_error(override, needle):
    """What a recipe does with `model:` (instantiate): a ConfigError naming the field, not a crash."""
    from engine.config import ConfigError, instantiate

    node = {
        "_component_": "engine.models.llama3.lora_llama3",
        "vocab_size": 64,
        "num_layers": 1,
        "num_heads": 4,
        "num_kv_heads": 2,
        "embed_dim": 64,
        "intermediate_dim": 64,
        "max_seq_len": 16,
        "lora_attn_modules": ["q_proj"],
        "lora_rank": 2,
        "lora_alpha": 4,
    }
    instantiate(dict(node))  # the unchanged node builds
    with pytest.raises(ConfigError) as info:
        instantiate({**node, **override})
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_tracker_database_that_is_a_folder_is_one_line(tunebench_home, capsys):
    (tunebench_home / "tunebench.db").mkdir(parents=True)
    _one_line_exit_2(capsys, ["runs"], "tunebench.db is not a file", "move it aside")


def test_following_a_run_that_failed_before_its_first_step_prints_only_the_reason(tunebench_home):
    import io

    from workbench.cli_progress import follow

    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="bad")
        update_run(
            rec.id, db=db, status="failed", exit_code=2,
            error="sft: tokenizer.path: /x: no such file or folder — point it at the model folder",
        )  # fmt: skip
    out = io.StringIO()
    assert follow(rec.id, stream=out, interactive=False) == 2
    assert out.getvalue().splitlines() == [
        "run bad failed (exit code 2): sft: tokenizer.path: /x: no such file or folder — point it at the model folder"
    ]
