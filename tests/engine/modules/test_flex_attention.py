"""FlexAttention's block mask for packed documents against the dense `[B,S,S]` mask path.

On CPU FlexAttention has a forward but no backward (PyTorch refuses it), so the CPU checks are: the
block mask is the dense mask exactly, the decoder's outputs through FlexAttention equal the dense
path's, and training on CPU falls back to the dense path. Outputs and gradients of the compiled kernel
against the dense path are checked on CUDA when one is present.
"""

import pytest
import torch

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
