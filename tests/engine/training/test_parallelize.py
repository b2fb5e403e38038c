"""parallelize on 2 gloo ranks (torchrun) equals one plain process; single-process checks of its errors."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config import ConfigError
from engine.training import materialize_model, parallelize
from tests.engine.training.tiny_decoder import TinyDecoder, tiny_decoder

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.distributed
def test_fsdp2_on_two_ranks_matches_one_process():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
           "-m", "tests.engine.training.dist_worker"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "OK " in proc.stdout, proc.stdout[-2000:]


def test_single_process_ac_and_compile_flags_without_mesh():
    model = tiny_decoder()
    parallelize(model, mesh=None, activation_checkpointing=2, fsdp=False)
    tokens = torch.randint(0, 128, (1, 8))
    torch.testing.assert_close(model(tokens), tiny_decoder()(tokens), atol=0, rtol=0)


def test_errors_name_the_field():
    with pytest.raises(ConfigError, match="need a device mesh"):
        parallelize(tiny_decoder(), mesh=None)
    with torch.device("meta"):
        model = TinyDecoder()
    with pytest.raises(ConfigError, match="checkpoint or an init function"):
        materialize_model(model, device="cpu")
    bad = tiny_decoder().state_dict()
    bad.pop("norm.weight")
    with pytest.raises(ConfigError, match="checkpoint: weights do not match"):
        materialize_model(model, device="cpu", state_dict=bad)


@pytest.mark.slow
def test_compile_per_block_keeps_outputs():
    model = tiny_decoder()
    parallelize(model, mesh=None, activation_checkpointing=True, compile=True, fsdp=False)
    tokens = torch.randint(0, 128, (2, 16))
    torch.testing.assert_close(model(tokens), tiny_decoder()(tokens), atol=1e-5, rtol=1e-5)


def test_cpu_offload_refused_on_cpu_mesh():
    class CpuMesh:
        device_type = "cpu"
        mesh_dim_names = ("dp",)

    with pytest.raises(ConfigError, match="fsdp_cpu_offload: the parameters already live in CPU memory"):
        parallelize(tiny_decoder(), mesh=CpuMesh(), cpu_offload=True)


def test_materialize_from_init_fn():
    with torch.device("meta"):
        model = TinyDecoder()
    materialize_model(model, device="cpu", init_fn=lambda m: m.load_state_dict(tiny_decoder().state_dict()))
    tokens = torch.randint(0, 128, (1, 8))
    torch.testing.assert_close(model(tokens), tiny_decoder()(tokens))


def test_single_process_group_and_shutdown_exit_code():
    script = (
        "from engine.training import init_distributed, build_world_mesh, shutdown\n"
        "import torch.distributed as dist\n"
        "info = init_distributed(force_process_group=True)\n"
        "mesh = build_world_mesh(info)\n"
        "print('world', dist.get_world_size(), info.rank, info.device, mesh.mesh_dim_names)\n"
        "try:\n"
        "    build_world_mesh(info, tp=2)\n"
        "except Exception as exc:\n"
        "    print('error', exc)\n"
        "shutdown(3)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "world 1 0 cpu ('dp_replicate', 'dp_shard', 'cp', 'tp')" in proc.stdout
    assert (
        "error tensor_parallel_dim: data_parallel_replicate_dim=1 x data_parallel_shard_dim=-1 x "
        in proc.stdout
    )
