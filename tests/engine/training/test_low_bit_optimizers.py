"""torchao AdamW8bit/4bit through our builders: they train like AdamW and hold far less state."""

import pytest
import torch

from engine.config import ConfigError
from engine.training import adamw_4bit, adamw_8bit, check_low_bit_optimizer_supported, optimizer_state_bytes


def _run(make, steps=3):
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 64, bias=False)  # 8,192 elements: quantised (>= 4,096)
    opt = make(layer.parameters())
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        layer(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return layer.weight.detach(), optimizer_state_bytes(opt)


# Relative error of the 3-step weight change vs AdamW (measured here: 0.011 for 8-bit, 0.24 for 4-bit).
@pytest.mark.parametrize(("builder", "max_rel_err"), [(adamw_8bit, 0.05), (adamw_4bit, 0.35)])
def test_low_bit_adamw_tracks_adamw_with_smaller_state(builder, max_rel_err):
    lr = 1e-2
    w_ref, bytes_ref = _run(lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.01))
    w, nbytes = _run(lambda p: builder(p, lr=lr, weight_decay=0.01))
    w0, _ = _run(lambda p: torch.optim.SGD(p, lr=0.0))
    assert (w_ref - w0).abs().max() > 2 * lr  # the weights did move
    rel_err = ((w - w_ref).norm() / (w_ref - w0).norm()).item()
    assert rel_err < max_rel_err, rel_err
    assert nbytes <= 0.3 * bytes_ref, (nbytes, bytes_ref)


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ConfigError, match="optimizer: AdamW8bit on CPU compiles .* C\\+\\+ compiler"):
        check_low_bit_optimizer_supported("cpu")
