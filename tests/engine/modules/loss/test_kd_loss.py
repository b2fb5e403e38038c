"""KD loss: chunked computation equals a plain full-logits reference (values and gradients)."""

import pytest
import torch
import torch.nn.functional as F

from engine.config import ConfigError
from engine.modules.loss import KDLoss


def _reference(sh, sw, th, tw, labels, kind, ratio, temp):
    """Whole [B,S,V] logits, plain torch ops."""
    keep = labels != -100
    s_logits = (sh @ sw.t())[keep].double()
    t_logits = (th @ tw.t())[keep].double()
    ce = F.cross_entropy(s_logits, labels[keep])
    s = F.log_softmax(s_logits / temp, -1)
    t = F.log_softmax(t_logits / temp, -1)
    fwd = F.kl_div(s, t, log_target=True, reduction="batchmean")  # KL(t || s)
    rev = F.kl_div(t, s, log_target=True, reduction="batchmean")  # KL(s || t)
    kd = {"forward": fwd, "reverse": rev, "symmetric": 0.5 * (fwd + rev)}[kind] * temp**2
    return (1 - ratio) * ce + ratio * kd, kd, ce


@pytest.mark.parametrize("kind", ["forward", "reverse", "symmetric"])
def test_chunked_equals_unchunked_reference(kind):
    g = torch.Generator().manual_seed(0)
    B, S, D, Dt, V = 2, 7, 8, 12, 50
    sh = torch.randn(B, S, D, generator=g, requires_grad=True)
    sw = torch.randn(V, D, generator=g, requires_grad=True)
    th, tw = torch.randn(B, S, Dt, generator=g), torch.randn(V, Dt, generator=g)
    labels = torch.randint(0, V, (B, S), generator=g)
    labels[0, :2] = -100
    labels[1, -1] = -100
    loss, kd, ce = KDLoss(kind=kind, kd_ratio=0.3, temperature=2.0, chunk_size=3)(sh, sw, th, tw, labels)
    loss.backward()
    grads = sh.grad.clone(), sw.grad.clone()
    sh.grad = sw.grad = None
    ref, ref_kd, ref_ce = _reference(sh, sw, th, tw, labels, kind, 0.3, 2.0)
    ref.backward()
    tol = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(loss.double(), ref, **tol)
    torch.testing.assert_close(kd.double(), ref_kd, **tol)
    torch.testing.assert_close(ce.double(), ref_ce, **tol)
    torch.testing.assert_close(grads[0], sh.grad, **tol)
    torch.testing.assert_close(grads[1], sw.grad, **tol)


def test_all_ignored_is_zero_and_bad_settings_name_field():
    loss, _, _ = KDLoss()(torch.randn(1, 3, 4), torch.randn(5, 4), torch.randn(1, 3, 4), torch.randn(5, 4),
                          torch.full((1, 3), -100))  # fmt: skip
    assert loss.item() == 0.0
    for kw, field in (
        ({"kind": "js"}, "kind"),
        ({"kd_ratio": 1.5}, "kd_ratio"),
        ({"temperature": 0}, "temperature"),
    ):
        with pytest.raises(ConfigError, match=field):
            KDLoss(**kw)
