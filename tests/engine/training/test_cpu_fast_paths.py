"""CPU fast paths: bf16 matmuls in fp32 give the native bf16 kernels' results (references: the fp32
product of the same bf16 values, and PyTorch's own bf16 kernels); keeping freed memory removes the
page faults of re-allocating large buffers; the recipes switch both on by themselves."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.config import ConfigError
from engine.training.cpu_fast_paths import (
    BF16_IN_FP32_NOTE,
    KEEP_FREED_NOTE,
    Bf16MatmulsInFp32,
    cpu_fast_paths,
    keep_freed_memory_for_cpu_training,
    wants_bf16_matmuls_in_fp32,
)

REPO = Path(__file__).resolve().parents[3]
BF16 = torch.bfloat16
# bf16 has an 8-bit significand: two results that differ only in summation order and the final
# rounding are within one or two bf16 ulps (2**-7 relative).
BF16_TOL = dict(rtol=2**-6, atol=2**-6)


def _bf16(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


@pytest.mark.parametrize(
    "op,args",
    [
        (torch.mm, lambda: (_bf16(32, 48, seed=0), _bf16(48, 40, seed=1))),
        (torch.addmm, lambda: (_bf16(40, seed=2), _bf16(32, 48, seed=0), _bf16(48, 40, seed=1))),
        (torch.bmm, lambda: (_bf16(3, 32, 48, seed=0), _bf16(3, 48, 40, seed=1))),
        (
            torch.baddbmm,
            lambda: (_bf16(3, 32, 40, seed=2), _bf16(3, 32, 48, seed=0), _bf16(3, 48, 40, seed=1)),
        ),
    ],
    ids=["mm", "addmm", "bmm", "baddbmm"],
)
def test_matmuls_equal_the_fp32_product_rounded_and_native_bf16(op, args):
    inputs = args()
    native = op(*inputs)
    mode = Bf16MatmulsInFp32()
    with mode:
        got = op(*inputs)
    assert mode.hits == 1 and got.dtype == BF16
    torch.testing.assert_close(got, op(*(t.float() for t in inputs)).to(BF16), rtol=0, atol=0)
    torch.testing.assert_close(got.float(), native.float(), **BF16_TOL)


def test_attention_forward_and_backward_match_native_bf16_with_gqa():
    q = _bf16(2, 8, 40, 16, seed=0).requires_grad_()
    k = _bf16(2, 4, 40, 16, seed=1).requires_grad_()
    v = _bf16(2, 4, 40, 16, seed=2).requires_grad_()
    grad_out = _bf16(2, 8, 40, 16, seed=3)

    def run():
        for t in (q, k, v):
            t.grad = None
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B,H,S,hd]
        out.backward(grad_out)
        return out.detach(), q.grad, k.grad, v.grad

    native = run()
    mode = Bf16MatmulsInFp32()
    with mode:
        got = run()
    assert mode.hits >= 2, "forward and backward attention kernels both take the fp32 path"
    for g, n in zip(got, native, strict=True):
        assert g.dtype == BF16
        torch.testing.assert_close(g.float(), n.float(), **BF16_TOL)


def test_training_steps_of_a_decoder_match_native_bf16():
    """Three AdamW steps of a tiny Llama in bf16: per-step losses and final weights as native bf16."""
    from engine.models.llama3 import llama3
    from engine.modules.loss import LinearCrossEntropyLoss

    def train(mode):
        torch.manual_seed(0)
        model = llama3(
            vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64,
            intermediate_dim=128, max_seq_len=32,
        ).to(BF16)  # fmt: skip
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = LinearCrossEntropyLoss()
        tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
        labels = torch.roll(tokens, -1, dims=1)
        losses = []
        with mode:
            for _ in range(3):
                loss = loss_fn(model.forward_hidden(tokens), model.output_weight, labels)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
        return losses, model.output_weight.detach().float()

    mode = Bf16MatmulsInFp32()
    fast_losses, fast_w = train(mode)
    native_losses, native_w = train(contextlib.nullcontext())
    assert mode.hits > 20  # every projection forward and backward, attention, the loss
    torch.testing.assert_close(fast_losses, native_losses, rtol=1e-2, atol=1e-2)
    # An Adam update moves a weight by about lr whatever the gradient's size, so a tiny gradient whose
    # sign differs by rounding can move it the other way: at most 2 * lr per step apart.
    torch.testing.assert_close(fast_w, native_w, rtol=2e-2, atol=2 * 1e-3 * 3)


def test_other_dtypes_and_tensor_subclasses_pass_through():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    mode = Bf16MatmulsInFp32()
    with mode:
        torch.mm(a, b)
        torch.mm(a.double(), b.double())
        (a.to(BF16) + b.to(BF16)).sum()  # elementwise ops stay bf16 kernels
    assert mode.hits == 0


def test_when_the_fp32_path_is_chosen(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("TUNEBENCH_CPU_BF16_MATMUL", "fp32")
    assert wants_bf16_matmuls_in_fp32(cpu, BF16)
    assert not wants_bf16_matmuls_in_fp32(cpu, torch.float32)
    assert not wants_bf16_matmuls_in_fp32(torch.device("cuda"), BF16)
    monkeypatch.setenv("TUNEBENCH_CPU_BF16_MATMUL", "native")
    assert not wants_bf16_matmuls_in_fp32(cpu, BF16)
    monkeypatch.setenv("TUNEBENCH_CPU_BF16_MATMUL", "auto")
    assert not wants_bf16_matmuls_in_fp32(cpu, BF16, compile=True)  # inductor picks its own kernels
    monkeypatch.setenv("TUNEBENCH_CPU_BF16_MATMUL", "fast")
    with pytest.raises(ConfigError, match="TUNEBENCH_CPU_BF16_MATMUL='fast': set it to auto, native or fp32"):
        wants_bf16_matmuls_in_fp32(cpu, BF16)
    monkeypatch.setenv("TUNEBENCH_CPU_BF16_MATMUL", "fp32")
    kept = []  # the allocator setting is process-wide: recorded here, measured in a subprocess below
    monkeypatch.setattr("engine.training.cpu_fast_paths.keep_freed_memory", lambda: kept.append(1) or True)
    with cpu_fast_paths("cpu", BF16) as note:
        assert note == BF16_IN_FP32_NOTE
    with cpu_fast_paths("cpu", torch.float32) as note:
        assert note is None
    with cpu_fast_paths("cuda", BF16) as note:
        assert note is None
    assert kept == [], "the matmul mode leaves the allocator alone"


def test_allocator_setting_is_one_explicit_logged_call(monkeypatch, caplog):
    import logging

    kept = []
    monkeypatch.setattr("engine.training.cpu_fast_paths.keep_freed_memory", lambda: kept.append(1) or True)
    with caplog.at_level(logging.INFO, logger="engine.training.cpu_fast_paths"):
        assert keep_freed_memory_for_cpu_training("cuda") is None
        assert kept == [] and not caplog.records
        assert keep_freed_memory_for_cpu_training("cpu") == KEEP_FREED_NOTE
    assert kept == [1] and [r.getMessage() for r in caplog.records] == [KEEP_FREED_NOTE]
    monkeypatch.setattr("engine.training.cpu_fast_paths.keep_freed_memory", lambda: False)  # not glibc
    assert keep_freed_memory_for_cpu_training("cpu") is None


def test_private_torch_symbols_are_looked_up_with_a_fallback(monkeypatch):
    """A torch without the CPU flash-attention ops upcasts the public matmuls only; one without the
    private CPU feature probes answers from /proc/cpuinfo's flags (read here independently)."""
    from engine.training import cpu_fast_paths as fp

    names = dict(fp._UPCAST_OP_NAMES, _no_such_op_in_any_torch=None)
    monkeypatch.setattr(fp, "_UPCAST_OP_NAMES", names)
    fp.upcast_ops.cache_clear()
    try:
        ops = fp.upcast_ops()
        assert torch.ops.aten.mm.default in ops and len(ops) == len(names) - 1
        a, b = _bf16(8, 16, seed=0), _bf16(16, 4, seed=1)
        mode = Bf16MatmulsInFp32()
        with mode:
            got = a @ b
        assert mode.hits == 1
        torch.testing.assert_close(got, (a.float() @ b.float()).to(BF16), rtol=0, atol=0)
    finally:
        monkeypatch.undo()
        fp.upcast_ops.cache_clear()

    flags = set()
    if Path("/proc/cpuinfo").exists():
        line = next(
            (ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), ""
        )
        flags = set(line.partition(":")[2].split())
    expected = bool(flags & {"avx512_bf16", "amx_bf16"})
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    fp.cpu_has_fast_bf16.cache_clear()
    try:
        assert fp.cpu_has_fast_bf16() is expected
    finally:
        monkeypatch.undo()
        fp.cpu_has_fast_bf16.cache_clear()
    with_probes = fp.cpu_has_fast_bf16()
    assert with_probes == bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def test_keeping_freed_memory_removes_page_faults_of_reallocation():
    """Ten "steps" that each build and free three 65 MB buffers (a `[512, 32000]` logit block, its exp,
    a `[32000, 512]` gradient), as a training step at vocab 32k does: glibc's default mmaps and
    page-faults them in every step."""
    script = textwrap.dedent(
        """
        import resource, sys, torch
        if sys.argv[1] == "keep":
            from engine.training.cpu_fast_paths import keep_freed_memory
            assert keep_freed_memory()
        def step():
            logits = torch.randn(512, 32000)
            probs = logits.exp()
            grad = torch.zeros(32000, 512)
            return float(probs.sum() + grad.sum())
        for _ in range(3):
            step()  # warm-up: the heap grows to the step's peak
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            step()
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    counts = {}
    for how in ("default", "keep"):
        done = subprocess.run(
            [sys.executable, "-c", script, how], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        counts[how] = int(done.stdout.split()[-1])
    assert counts["default"] > 10 * 3 * 10_000, counts  # ~16k 4 KiB pages per buffer per step
    assert counts["keep"] < counts["default"] / 5, counts


def test_sft_recipe_in_bf16_on_cpu_uses_the_fp32_path_and_says_so(shared_assets, tmp_path, tunebench_home):
    """`python -m engine.recipes.sft` in bf16 on this CPU: the note on stderr, and the same step losses
    (read back from the tracker) as with the native bf16 kernels (TUNEBENCH_CPU_BF16_MATMUL=native)."""
    from tests.engine.recipes._sft_helpers import losses, new_run, recipe_env, tiny_config, write_config

    curves = {}
    for choice in ("fp32", "native"):
        cfg = tiny_config(shared_assets, tmp_path / choice, dtype="bf16", max_steps_per_epoch=3)
        run_id = new_run(tunebench_home)
        env = dict(recipe_env(tunebench_home, run_id), TUNEBENCH_CPU_BF16_MATMUL=choice)
        done = subprocess.run(
            [sys.executable, "-m", "engine.recipes.sft", "--config", str(write_config(cfg, tmp_path / f"{choice}.yaml"))],
            capture_output=True, text=True, env=env, timeout=300, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert (BF16_IN_FP32_NOTE in done.stderr) == (choice == "fp32"), done.stderr[-2000:]
        curves[choice] = [v for _, v in losses(tunebench_home, run_id)]
    assert len(curves["fp32"]) == 3
    torch.testing.assert_close(curves["fp32"], curves["native"], rtol=2e-2, atol=2e-2)
