"""Process-group setup for torchrun launches and the clean shutdown every rank ends with.

Backend: nccl when CUDA is available (one GPU per local rank), gloo on CPU. A plain `python -m ...`
start (no torchrun environment) runs as rank 0 of 1, with no process group unless asked for one.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from engine.config import ConfigError
from engine.training.device_mesh import ParallelDims, build_device_mesh, parallel_dims


@dataclass(frozen=True)
class DistributedInfo:
    """Where this process sits: `rank`, `world_size`, `local_rank`, and its compute `device`."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(*, force_process_group: bool = False, timeout_s: int = 1800) -> DistributedInfo:
    """Join the torchrun job (or stay a single process) and pick this rank's device.

    Args:
        force_process_group: also create a 1-rank group when not launched by torchrun (so FSDP2 /
            DTensor code paths can run in one process).
        timeout_s: collective timeout.

    Raises:
        ConfigError: more ranks on a node than GPUs under CUDA.
    """
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"local rank {local_rank} has no GPU (this node has {torch.cuda.device_count()})",
                hint="lower --nproc_per_node",
                field="nproc_per_node",
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized() and (launched or force_process_group):
        kwargs = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
        if backend == "nccl":
            kwargs["device_id"] = device
        if not launched:
            kwargs.update(init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        dist.init_process_group(**kwargs)
    return DistributedInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def build_world_mesh(info: DistributedInfo, dims: ParallelDims | None = None, *, tp: int = 1) -> DeviceMesh:
    """The run's 4-D mesh (`engine.training.device_mesh.MESH_DIMS`) over `info.world_size` ranks.

    Args:
        dims: the degrees (`parallel_dims(cfg, world_size)`); None: `tp` tensor parallel, the rest
            data-parallel shards.

    Raises:
        ConfigError: degrees whose product is not the world size (one line naming the keys).
    """
    if dims is None:
        dims = parallel_dims({"tensor_parallel_dim": tp}, info.world_size)
    elif dims.world_size != info.world_size:
        raise ConfigError(
            f"the mesh {dims.describe()} has {dims.world_size} ranks, the run {info.world_size}",
            hint="make the parallel degrees multiply to the number of processes",
            field="data_parallel_shard_dim",
        )
    return build_device_mesh(dims, info.device.type)


def shutdown(code: int = 0) -> NoReturn:
    """End this rank: barrier, destroy the process group, flush output, `os._exit(code)`.

    `os._exit` skips interpreter teardown, where FSDP2 on gloo can abort after a clean run.
    """
    if dist.is_available() and dist.is_initialized():
        try:
            if code == 0:
                dist.barrier()
            dist.destroy_process_group()
        except Exception as exc:  # a peer already gone: still exit with our own code
            print(f"warning: process group shutdown: {exc}", file=sys.stderr)
    record_exit_code(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


EXIT_DIR_ENV = "TUNEBENCH_EXIT_DIR"


def record_exit_code(code: int) -> None:
    """Write this rank's exit code to `$TUNEBENCH_EXIT_DIR/rank<RANK>` when the launcher set that folder.

    torchrun exits 1 whatever its workers returned; the supervisor reads these files to record the
    recipe's own code (2 bad config, 1 NaN). Written atomically; a failure to write is one warning.
    """
    folder = os.environ.get(EXIT_DIR_ENV)
    if not folder:
        return
    rank = int(os.environ.get("RANK", "0"))
    try:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / f".rank{rank}.tmp"
        tmp.write_text(f"{int(code)}\n")
        os.replace(tmp, path / f"rank{rank}")
    except OSError as exc:
        print(f"warning: could not record the exit code in {folder}: {exc}", file=sys.stderr)


def rank_world() -> tuple[int, int]:
    """`(rank, world_size)` of this process; `(0, 1)` without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over ranks in place (a no-op on one process); returns it."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
