"""Two CPU-only speed-ups the recipes switch on for themselves when they train on the CPU.

1. `keep_freed_memory()`: glibc hands every allocation above its mmap threshold (128 KiB, growing to
   at most 32 MiB) straight to `mmap` and gives it back with `munmap` when freed. A training step
   allocates the same large buffers every time (`[N, V]` logit blocks, `[V, D]` embedding and output
   gradients: 65 MB each at vocab 32k, dim 512), so every step page-faults them in again, one 4 KiB
   page at a time, and the kernel zeroes each page: ~60k faults and ~10% of a 50M-parameter step on
   this project's 2-core box (docs/BENCHMARKS.md, SFT; the test counts the faults of that allocation
   pattern with and without). Raising the
   mmap and trim thresholds keeps freed memory in the process for the next step. Resident memory
   stays at the step's peak instead of dropping between steps; nothing else changes.

2. `Bf16MatmulsInFp32`: on CPUs without bf16 instructions (no AVX512-BF16, no AMX — e.g. AVX2-only
   EPYC or Xeon) PyTorch's bf16 GEMM and CPU flash attention fall back to scalar code, ~40x slower
   than fp32 GEMM. Inside this mode every bf16 `mm`/`addmm`/`bmm`/`baddbmm` and the CPU flash-attention
   forward/backward run on fp32 copies of their inputs and round the result back to bf16. A product
   of two bf16 values is exact in fp32 and a bf16 GEMM accumulates in fp32 anyway, so the result is
   the one a native bf16 kernel would give up to summation order (one bf16 rounding at the end):
   parameters, activations and gradients stay bf16, only the arithmetic runs on the fast path.
   Elementwise ops are left alone (they are memory-bound and already vectorised for bf16). The price
   is a transient fp32 copy of each matmul's inputs (for the output projection of an 8B model, 2 GiB
   while that one product runs).

The allocator setting is process-wide and cannot be undone, so it is its own explicit call:
`keep_freed_memory_for_cpu_training(device)`, made once by `engine.recipes._entry.run_recipe_main`
before training (and by bench/sft_throughput.py), which logs what it did. `cpu_fast_paths(device, dtype,
compile=...)` is the matmul mode only, for the block it wraps: a bf16 CPU run on such a CPU gets it
(unless the blocks are `torch.compile`d: inductor then picks its own kernels and a dispatch mode would
only get in its way). `TUNEBENCH_CPU_BF16_MATMUL=native|fp32` forces the matmul choice either way (auto
by default).

Upgrade guards: the CPU feature probes (`torch.cpu._is_avx512_bf16_supported`, `_is_amx_tile_supported`)
and the CPU flash-attention ops are private torch symbols, looked up when first needed; a missing probe
falls back to the CPU flags in /proc/cpuinfo, a missing op is simply not upcast (the public matmuls
still are). `TorchDispatchMode` lives in the private `torch.utils._python_dispatch`; torch's version
is bounded in pyproject.toml for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Iterator

import torch

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # moved by a later torch: the bf16 mode is off (native kernels), the rest works
    TorchDispatchMode = None

from engine.config import ConfigError

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP_BYTES = 1 << 30  # allocations below 1 GiB come from the heap and stay there once freed
_NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes: freed heap memory is not handed back

log = logging.getLogger(__name__)

# op name in torch.ops.aten -> indices of its outputs that are bf16 when the inputs are (the others,
# e.g. the logsumexp, stay fp32), or None for an op with one tensor out
_UPCAST_OP_NAMES: dict[str, tuple[int, ...] | None] = {
    "mm": None,
    "addmm": None,
    "bmm": None,
    "baddbmm": None,
    "_scaled_dot_product_flash_attention_for_cpu": (0,),  # private ops: skipped where torch lacks them
    "_scaled_dot_product_flash_attention_for_cpu_backward": (0, 1, 2),
}


@functools.cache
def upcast_ops() -> dict:
    """The ops `Bf16MatmulsInFp32` runs in fp32 (op overload -> bf16 output indices), looked up on
    first use; an op this torch does not have is left out."""
    ops = {}
    for name, outputs in _UPCAST_OP_NAMES.items():
        try:
            ops[getattr(torch.ops.aten, name).default] = outputs
        except (AttributeError, RuntimeError):  # an op (or its default overload) this torch lacks
            continue
    return ops


def keep_freed_memory() -> bool:
    """Keep freed allocations under 1 GiB in the process (glibc only). True when it was applied.
    Process-wide and permanent; training calls `keep_freed_memory_for_cpu_training` instead."""
    path = ctypes.util.find_library("c")
    if not path:
        return False
    try:
        libc = ctypes.CDLL(path)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


KEEP_FREED_NOTE = (
    "allocator: freed blocks under 1 GiB stay in the process for the next step (glibc mallopt, process-wide)"
)


def keep_freed_memory_for_cpu_training(device: torch.device | str) -> str | None:
    """The process-wide allocator setting for a training run on `device`: on the CPU, glibc keeps
    freed allocations under 1 GiB for reuse (see the module docstring; resident memory then stays at
    a step's peak). Call once, before training. Returns the line it logged (`KEEP_FREED_NOTE`), or
    None when nothing changed (a CUDA device, or not glibc)."""
    if torch.device(device).type != "cpu" or not keep_freed_memory():
        return None
    log.info(KEEP_FREED_NOTE)
    return KEEP_FREED_NOTE


def _cpuinfo_flags() -> set[str]:
    """The CPU flags Linux lists in /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _probe(name: str) -> bool | None:
    """`torch.cpu.<name>()` (a private feature probe), or None where this torch has no such probe."""
    fn = getattr(torch.cpu, name, None)
    if not callable(fn):
        return None
    try:
        return bool(fn())
    except (RuntimeError, NotImplementedError):
        return None


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX) that PyTorch's kernels use:
    torch's own probes, else the CPU flags (avx512_bf16, amx_bf16) where torch lacks them."""
    probes = [_probe("_is_avx512_bf16_supported"), _probe("_is_amx_tile_supported")]
    if any(probes):
        return True
    if all(p is not None for p in probes):
        return False
    return bool(_cpuinfo_flags() & {"avx512_bf16", "amx_bf16"})


def _plain(x: object) -> bool:
    return type(x) is torch.Tensor or type(x) is torch.nn.Parameter


def _plain_cpu_bf16(x: object) -> bool:
    return _plain(x) and x.dtype == torch.bfloat16 and x.device.type == "cpu"


def _to_fp32(x: object) -> object:
    return x.float() if _plain_cpu_bf16(x) else x


class Bf16MatmulsInFp32(TorchDispatchMode or object):
    """Run bf16 CPU matmuls and flash attention on fp32 copies, rounding results back to bf16.

    Only plain CPU tensors (and parameters) are touched: an op with a tensor subclass argument (DTensor,
    NF4) passes through, and reaches this mode again with plain tensors once the subclass has unwrapped
    itself; every other op and every other dtype runs unchanged. `hits` counts the ops that took the
    fp32 path.
    """

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0
        self._ops = upcast_ops()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ops = self._ops
        if func not in ops:  # every op passes here: leave the others at once
            return func(*args, **kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if not any(_plain_cpu_bf16(t) for t in tensors) or not all(_plain(t) for t in tensors):
            return func(*args, **kwargs)  # not bf16, or a subclass (it unwraps itself and comes back)
        bf16_outputs = ops[func]
        self.hits += 1
        out = func(*(_to_fp32(a) for a in args), **{k: _to_fp32(v) for k, v in kwargs.items()})
        if isinstance(out, torch.Tensor):
            return out.to(torch.bfloat16)
        return tuple(
            o.to(torch.bfloat16) if isinstance(o, torch.Tensor) and i in bf16_outputs else o
            for i, o in enumerate(out)
        )


def wants_bf16_matmuls_in_fp32(device: torch.device, dtype: torch.dtype, *, compile: bool = False) -> bool:
    """Whether `cpu_fast_paths` runs bf16 matmuls in fp32 for this run (see the module docstring).

    Raises:
        ConfigError: TUNEBENCH_CPU_BF16_MATMUL set to something other than auto, native or fp32.
    """
    choice = os.environ.get("TUNEBENCH_CPU_BF16_MATMUL", "auto").strip().lower() or "auto"
    if choice not in ("auto", "native", "fp32"):
        raise ConfigError(
            "set it to auto, native or fp32 (or unset it)",
            label=f"environment TUNEBENCH_CPU_BF16_MATMUL={choice!r}",
            field="TUNEBENCH_CPU_BF16_MATMUL",
        )
    if torch.device(device).type != "cpu" or dtype != torch.bfloat16 or choice == "native":
        return False
    if TorchDispatchMode is None:  # this torch has no dispatch modes where we look for them
        return False
    return choice == "fp32" or (not compile and not cpu_has_fast_bf16())


BF16_IN_FP32_NOTE = (
    "this CPU has no bf16 matrix instructions: bf16 matmuls and attention run in fp32 and round to bf16 "
    "(TUNEBENCH_CPU_BF16_MATMUL=native turns this off)"
)


@contextlib.contextmanager
def cpu_fast_paths(
    device: torch.device | str, dtype: torch.dtype, *, compile: bool = False
) -> Iterator[str | None]:
    """The bf16 matmul mode where it applies to a run on `device` in `dtype` (see
    `wants_bf16_matmuls_in_fp32`), active inside the block only, on this thread. Yields
    `BF16_IN_FP32_NOTE` when bf16 matmuls run in fp32 (for the run's log), else None. The allocator
    setting is not made here: it is `keep_freed_memory_for_cpu_training`, called once by the caller."""
    if not wants_bf16_matmuls_in_fp32(torch.device(device), dtype, compile=compile):
        yield None
        return
    with Bf16MatmulsInFp32():
        yield BF16_IN_FP32_NOTE
