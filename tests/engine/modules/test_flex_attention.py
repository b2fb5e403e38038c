"""FlexAttention's block mask for packed documents against the dense `[B,S,S]` mask path.

On CPU FlexAttention has a forward but no backward (PyTorch 2.13 raises NotImplementedError), so the
CPU checks are: the block mask is the dense mask exactly, the decoder's outputs through FlexAttention
equal the dense path's, FlexAttention's gradients (the derivatives of its own CPU forward, by central
differences in float64) equal autograd's through the dense path, and training on CPU falls back to
the dense path. Outputs and gradients of the compiled kernel against the dense path are checked on
CUDA when one is present.
"""

import pytest
import torch
import torch.nn.functional as F

from engine.models.llama3 import SIZES, llama3
from engine.modules.attention_masks import block_causal_mask, sliding_window_mask
from engine.modules.flex_attention import FlexDocumentMask

DOCS = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4 + [3] * 8 + [4] * 8, [0] * 19 + [1] * 13])  # [2, 32]


def _packed():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (2, 32), generator=g)
    pos = torch.cat([torch.arange(n) for n in (5, 7, 4, 8, 8, 19, 13)]).view(2, 32)
    return tokens, pos


def _model(backend: str, **kw):
    torch.manual_seed(0)
    model = llama3(**{**SIZES["llama3_tiny"], **kw})
    model.attention_backend = backend
    return model


@pytest.mark.parametrize("window", [None, 6])
def test_block_mask_is_the_dense_block_causal_mask(window):
    expected = block_causal_mask(DOCS)
    if window is not None:
        expected = expected & sliding_window_mask(torch.arange(32), 32, window)
    spec = FlexDocumentMask(DOCS, window)
    assert torch.equal(spec.dense(), expected)
    # The block mask itself: tiles of 128 (one tile here) marked partial, none skipped wrongly.
    assert torch.equal(spec.block_mask.to_dense().bool()[:, 0], torch.ones(2, 1, 1, dtype=torch.bool))


def test_decoder_outputs_through_flex_equal_the_dense_path_on_cpu():
    tokens, pos = _packed()
    flex, dense = _model("flex"), _model("sdpa")
    assert isinstance(flex._attention_mask(tokens, DOCS, None, None, pos), FlexDocumentMask)
    assert isinstance(dense._attention_mask(tokens, DOCS, None, None, pos), torch.Tensor)
    with torch.no_grad():  # FlexAttention's own CPU forward (it has no CPU backward)
        torch.testing.assert_close(
            flex(tokens, position_ids=pos, document_ids=DOCS),
            dense(tokens, position_ids=pos, document_ids=DOCS),
            atol=2e-5,
            rtol=2e-5,
        )


@pytest.mark.parametrize("window, kv_heads", [(None, 4), (6, 2)])
def test_flex_gradients_equal_the_dense_path_on_cpu(monkeypatch, window, kv_heads):
    # No CPU backward to call: FlexAttention's gradient along a random direction u of q, k or v is
    # (f(x + eps u) - f(x - eps u)) / 2 eps of its own forward (float64, exact to ~1e-16 here, so the
    # difference quotient is good to ~1e-9); autograd through SDPA on the dense mask must give <grad, u>.
    import torch.nn.attention.flex_attention as flex_module

    calls = []
    real_flex = flex_module.flex_attention
    monkeypatch.setattr(
        flex_module, "flex_attention", lambda *a, **kw: calls.append(1) or real_flex(*a, **kw)
    )
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, 32, 16, dtype=torch.float64, generator=g)
    k, v = (torch.randn(2, kv_heads, 32, 16, dtype=torch.float64, generator=g) for _ in range(2))
    cotangent = torch.randn(2, 4, 32, 16, dtype=torch.float64, generator=g)
    spec = FlexDocumentMask(DOCS, window)

    mask = block_causal_mask(DOCS)
    if window is not None:
        mask = mask & sliding_window_mask(torch.arange(32), 32, window)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dense = F.scaled_dot_product_attention(*leaves, attn_mask=mask[:, None], enable_gqa=kv_heads != 4)
    (dense * cotangent).sum().backward()

    def flex_objective(qq, kk, vv) -> torch.Tensor:
        return (spec.attend(qq, kk, vv, dropout_p=0.0) * cotangent).sum()

    torch.testing.assert_close(spec.attend(q, k, v, dropout_p=0.0), dense.detach(), atol=1e-12, rtol=1e-12)
    eps = 1e-6
    for i, leaf in enumerate(leaves):
        for _ in range(2):
            u = torch.randn(leaf.shape, dtype=torch.float64, generator=g)
            plus, minus = [q, k, v], [q, k, v]
            plus[i], minus[i] = plus[i] + eps * u, minus[i] - eps * u
            derivative = (flex_objective(*plus) - flex_objective(*minus)) / (2 * eps)
            torch.testing.assert_close(
                derivative, (leaf.grad * u).sum(), atol=1e-7, rtol=1e-7, msg=f"d/d{'qkv'[i]}"
            )
    assert len(calls) == 1 + 3 * 2 * 2  # every forward above went through FlexAttention itself


def test_auto_keeps_the_dense_mask_on_cpu_and_training_falls_back():
    tokens, pos = _packed()
    assert isinstance(_model("auto")._attention_mask(tokens, DOCS, None, None, pos), torch.Tensor)
    flex, dense = _model("flex"), _model("sdpa")
    flex(tokens, position_ids=pos, document_ids=DOCS).sum().backward()  # CPU backward: the dense fallback
    dense(tokens, position_ids=pos, document_ids=DOCS).sum().backward()
    for (name, a), b in zip(flex.named_parameters(), dense.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-6, msg=name)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="compiled FlexAttention (and its backward) needs CUDA"
)
def test_compiled_flex_equals_dense_outputs_and_gradients_on_cuda():
    tokens, pos = (t.cuda() for t in _packed())
    docs = DOCS.cuda()
    flex, dense = _model("auto").cuda(), _model("sdpa").cuda()
    assert isinstance(flex._attention_mask(tokens, docs, None, None, pos), FlexDocumentMask)
    out_f = flex(tokens, position_ids=pos, document_ids=docs)
    out_d = dense(tokens, position_ids=pos, document_ids=docs)
    torch.testing.assert_close(out_f, out_d, atol=2e-4, rtol=2e-4)
    out_f.float().pow(2).mean().backward()
    out_d.float().pow(2).mean().backward()
    for (name, a), b in zip(flex.named_parameters(), dense.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=2e-4, rtol=2e-3, msg=name)
