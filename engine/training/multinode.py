"""What a rank does differently when the run spans several nodes (torchrun `--nnodes N`).

Only node rank 0's host holds the run's tracker row (`workbench.launcher`); the other nodes start their
ranks without `TUNEBENCH_RUN_ID`, so they write nothing locally. Two things cross the nodes through the
process group instead:

- `per_rank_memory`: every rank's memory figures are gathered to rank 0, which logs them under each
  rank's number, so the one tracker row has every rank's `mem_peak_gb` (one all-gather of a few
  floats per step, only in multi-node runs).
- `check_shared_output_dir`: every rank writes its checkpoint shard into `output_dir`, so the folder
  must be one that every node mounts at the same path. Each node's local rank 0 writes a marker named
  with a token rank 0 chose; rank 0 checks it sees every node's marker; otherwise every rank stops
  with one line (exit 2) before anything is trained or saved.

The node layout comes from torchrun's environment: `WORLD_SIZE`, `LOCAL_WORLD_SIZE` (ranks per node),
`GROUP_RANK` (this node's rank), `LOCAL_RANK`.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from engine.config import ConfigError

MARKER_DIR = ".nodes"


def node_layout() -> tuple[int, int]:
    """(number of nodes, this node's rank) from torchrun's environment; (1, 0) without it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return max(1, world // max(1, per_node)), int(os.environ.get("GROUP_RANK", "0"))


def is_multinode() -> bool:
    return dist.is_available() and dist.is_initialized() and node_layout()[0] > 1


def per_rank_memory(memory: dict[str, float], device: torch.device) -> dict[int, dict[str, float]]:
    """`{rank: figures}` this rank should log: its own on one node; on several nodes, rank 0 gets
    every rank's (gathered) and the other ranks nothing. Called by every rank at the same point."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if not is_multinode():
        return {rank: memory}
    names = sorted(memory)
    mine = torch.tensor([float(memory[n]) for n in names], dtype=torch.float64, device=device)  # [k]
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if rank != 0:
        return {}
    return {r: dict(zip(names, t.tolist(), strict=True)) for r, t in enumerate(every)}


def check_shared_output_dir(output_dir: str | os.PathLike, *, visible_within_s: float = 10.0) -> None:
    """Refuse (`ConfigError` on every rank) an `output_dir` that rank 0 does not see every node write to.

    No-op on one node. Markers are `output_dir/.nodes/<token>.node<N>` (the token is fresh per launch,
    so an old run's markers never count) and are removed afterwards. A network filesystem may show a
    new file late: rank 0 looks again for up to `visible_within_s` seconds.
    """
    if not is_multinode():
        return
    nnodes, node = node_layout()
    rank = dist.get_rank()
    box = [secrets.token_hex(8) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    token = box[0]
    folder = Path(output_dir) / MARKER_DIR
    marker = folder / f"{token}.node{node}"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    error = ""
    if local_rank == 0:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{marker.name}.tmp"
            tmp.write_text(f"{socket.gethostname()}\n")
            os.replace(tmp, marker)
        except OSError as exc:
            error = f"node {node} cannot write there ({exc.strerror})"
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    verdict = [next((e for e in errors if e), "")]
    if rank == 0 and not verdict[0]:
        deadline = time.monotonic() + visible_within_s
        while True:
            seen = set(os.listdir(folder)) if folder.is_dir() else set()
            missing = [n for n in range(nnodes) if f"{token}.node{n}" not in seen]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if missing:
            verdict[0] = (
                f"rank 0 ({socket.gethostname()}) does not see the marker node(s) {missing} wrote there"
            )
    dist.broadcast_object_list(verdict, src=0)
    if local_rank == 0:
        marker.unlink(missing_ok=True)
    if verdict[0]:
        raise ConfigError(
            verdict[0],
            field="output_dir",
            label=f"output_dir {output_dir}",
            hint="checkpoints are written by every rank, so put output_dir (tunebench run --output-dir DIR) "
            "on a folder every node mounts at the same path (NFS, Lustre, ...)",
        )
