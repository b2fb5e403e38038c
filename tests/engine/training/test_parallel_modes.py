"""Every parallel mode of the one mesh on 2 gloo ranks (4 for tp x cp and cp x data parallel;
torchrun) equals one plain process: per-step losses, gradient norms and final weights within 2e-5
(fp32; see parallel_worker.py)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _torchrun(*modes: str, nproc: int = 2) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", port,
           "-m", "tests.engine.training.parallel_worker", *modes]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for mode in modes:
        assert f"OK {mode} " in proc.stdout, proc.stdout[-2000:]
    return proc.stdout


@pytest.mark.distributed
def test_tp_sp_loss_parallel_lora_qlora_cp_and_hsdp_equal_one_rank():
    _torchrun("tp", "lora", "qlora", "cp", "hsdp")


@pytest.mark.distributed
@pytest.mark.slow
def test_tied_embeddings_and_dora_under_tp_equal_one_rank():
    _torchrun("tied", "dora")


@pytest.mark.distributed
@pytest.mark.slow
def test_tp_times_cp_on_four_ranks_equals_one_rank():
    _torchrun("tpcp", nproc=4)


@pytest.mark.distributed
def test_qlora_under_fsdp2_equals_one_rank():
    # NF4 bases sharded by FSDP2 where they split evenly (the MLP's), whole elsewhere (the attention's).
    _torchrun("qlorafsdp")


@pytest.mark.distributed
def test_cp_with_compiled_blocks_equals_one_rank():
    # cp=2, every block torch.compiled (inductor, CPU) around the eager ring.
    _torchrun("cpcompile")


@pytest.mark.distributed
def test_cp_with_hsdp_and_with_fsdp_on_four_ranks_equal_one_rank():
    _torchrun("cphsdp", "cpfsdp", nproc=4)


@pytest.mark.distributed
def test_resume_under_tp_and_under_cp_equals_the_uninterrupted_run():
    _torchrun("tpresume", "cpresume")


@pytest.mark.distributed
@pytest.mark.slow  # the same FSDP2 shard path as qlorafsdp (default suite), on other meshes
def test_qlora_under_hsdp_and_under_cp_on_four_ranks_equal_one_rank():
    _torchrun("qlorahsdp", "qloracp", nproc=4)
