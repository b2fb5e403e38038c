"""Process-level settings every recipe makes the same way: dtype and device from the config, seeding,
and calling a module with another forward (so FSDP2's and compile's hooks stay in the path)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from engine.config import ConfigError

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def parse_dtype(name: str, *, field: str = "dtype") -> torch.dtype:
    """`fp32` / `bf16` (or their long names) -> torch dtype. Raises ConfigError otherwise."""
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise ConfigError(f"unknown dtype {name!r}", hint="use fp32 or bf16", field=field) from None


def pick_device(name: str | None, dist_info: Any = None) -> torch.device:
    """`cpu`, `cuda`, or `auto`/None (CUDA when present); on CUDA with `dist_info` (from
    `init_distributed`, several processes) the local rank's own GPU. Raises ConfigError for cuda
    without a GPU."""
    name = (name or "auto").lower()
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "cuda requested but no CUDA device is visible", hint="set device=cpu", field="device"
        )
    elif name not in ("cpu",) and not name.startswith("cuda"):
        raise ConfigError(f"unknown device {name!r}", hint="use cpu, cuda or auto", field="device")
    else:
        device = torch.device(name)
    if dist_info is not None and device.type == "cuda":
        return dist_info.device  # one GPU per local rank
    return device


def set_seed(seed: int) -> None:
    """Seed python, torch (CPU + CUDA) and numpy; every rank uses the same seed."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


@contextlib.contextmanager
def forward_replaced(model: nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """Within the block, `model(...)` runs `forward(...)` instead of `model.forward`.

    Calling the module (rather than a method directly) keeps FSDP2's and compile's hooks in the
    path: a sharded root's parameters are gathered for the call and their gradients reduced after
    backward. The SFT recipe runs the decoder's hidden states AND the linear cross-entropy (which
    reads `model.output_weight`) inside one such call, so the output weight is gathered while used
    and the `[B,S,V]` logits never exist.
    """
    model.forward = forward
    try:
        yield
    finally:
        del model.forward
