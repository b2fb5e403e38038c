"""torchao's 8-bit and 4-bit AdamW as `_component_` builders, with a CPU support check.

`torchao.optim.AdamW8bit` / `AdamW4bit` (torchao >= 0.14; in 0.18 they live at `torchao.optim`) keep
`exp_avg` and `exp_avg_sq` block-quantised: about 2 bytes (8-bit) or 1 byte (4-bit) of state per
parameter instead of 8, for tensors of at least 4,096 elements (smaller ones stay fp32). Each
parameter's update is a `torch.compile`d function, so the first step compiles once per parameter
shape: on CUDA through Triton, on CPU through inductor's C++ backend, which needs a C++ compiler
(`c++`/`g++`/`clang++` on PATH or `CXX`). Expect that first step to take seconds per distinct shape.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

import torch
from torch.optim import Optimizer

from engine.config import ConfigError


def check_low_bit_optimizer_supported(device: torch.device | str = "cpu", *, name: str = "AdamW8bit") -> None:
    """Raise `ConfigError` when torchao's low-bit optimizers cannot run on `device`.

    CUDA needs Triton (bundled with CUDA builds of torch); CPU needs a C++ compiler for inductor.

    Raises:
        ConfigError: torchao missing, no C++ compiler (CPU), or no Triton (CUDA).
    """
    from engine.modules.torchao_import import import_torchao

    try:
        import_torchao("torchao.optim")
    except ImportError as exc:
        raise ConfigError(
            f"{name} needs torchao (pip install 'torchao>=0.14'): {exc}", field="optimizer"
        ) from None
    kind = torch.device(device).type
    if kind == "cpu":
        compilers = [os.environ.get("CXX", ""), "c++", "g++", "clang++"]
        if not any(c and shutil.which(c) for c in compilers):
            raise ConfigError(
                f"{name} on CPU compiles its update with a C++ compiler and none was found",
                hint="install g++ (or set CXX), or use torch.optim.AdamW",
                field="optimizer",
            )
    elif kind == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"{name} on CUDA needs triton",
                hint="install it, or use torch.optim.AdamW",
                field="optimizer",
            ) from None


def _params_device(params: list) -> torch.device:
    for item in params:
        tensors = item["params"] if isinstance(item, dict) else [item]
        for t in tensors:
            return t.device
    return torch.device("cpu")


def adamw_8bit(
    params: Iterable,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    block_size: int = 256,
    bf16_stochastic_round: bool = False,
) -> Optimizer:
    """AdamW with 8-bit blockwise-quantised moments (`torchao.optim.AdamW8bit`).

    Args:
        block_size: elements sharing one scale; default 256.
        bf16_stochastic_round: stochastic rounding of bf16 weights (helps pure-bf16 training).

    Raises:
        ConfigError: see `check_low_bit_optimizer_supported`.
    """
    return _torchao_adamw(
        "AdamW8bit", params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, block_size=block_size,
        bf16_stochastic_round=bf16_stochastic_round,
    )  # fmt: skip


def adamw_4bit(
    params: Iterable,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    block_size: int = 128,
    bf16_stochastic_round: bool = False,
) -> Optimizer:
    """AdamW with 4-bit quantised moments (`torchao.optim.AdamW4bit`); arguments as `adamw_8bit`.

    Raises:
        ConfigError: see `check_low_bit_optimizer_supported`.
    """
    return _torchao_adamw(
        "AdamW4bit", params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, block_size=block_size,
        bf16_stochastic_round=bf16_stochastic_round,
    )  # fmt: skip


def _torchao_adamw(name: str, params: Iterable, *, betas: tuple[float, float], **kwargs) -> Optimizer:
    """`torchao.optim.<name>` over `params`, after the device check (`check_low_bit_optimizer_supported`)."""
    params = list(params)
    check_low_bit_optimizer_supported(_params_device(params), name=name)
    from engine.modules.torchao_import import import_torchao

    optimizer_cls = getattr(import_torchao("torchao.optim"), name)
    return optimizer_cls(params, betas=tuple(betas), **kwargs)


def optimizer_state_bytes(optimizer: Optimizer) -> int:
    """Bytes held by the optimizer's state tensors (quantised subclasses counted by their storage)."""
    total = 0
    seen: set[int] = set()

    def add(t: torch.Tensor) -> None:
        nonlocal total
        inner = getattr(t, "__tensor_flatten__", None)
        if inner is not None and type(t) is not torch.Tensor:
            names, _ = t.__tensor_flatten__()
            for n in names:
                add(getattr(t, n))
            return
        key = t.untyped_storage().data_ptr()
        if key in seen:
            return
        seen.add(key)
        total += t.untyped_storage().nbytes()

    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                add(value)
    return total
