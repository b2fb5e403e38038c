"""TransformerDecoder behaviour: packing, KV-cache decoding, left padding, hidden-state API.
References are the same model run the plain way (one document / full sequence at a time)."""

from __future__ import annotations

import torch

from engine.models.llama3 import llama3_tiny
from engine.models.mistral import mistral_tiny
from engine.models.qwen3 import qwen3_tiny
from engine.modules.attention_masks import cache_causal_mask

ATOL = 1e-5
RTOL = 1e-5  # logits here are O(10): allow fp32 reduction-order differences relative to size


def _model(builder=llama3_tiny, seed=0):
    torch.manual_seed(seed)
    model = builder().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_packed_documents_equal_separate_runs():
    model = _model(qwen3_tiny)
    doc_a = torch.randint(0, 256, (1, 7))
    doc_b = torch.randint(0, 256, (1, 5))
    packed = torch.cat([doc_a, doc_b], dim=1)  # [1, 12]
    document_ids = torch.tensor([[0] * 7 + [1] * 5])
    position_ids = torch.tensor([list(range(7)) + list(range(5))])
    with torch.no_grad():
        got = model(packed, position_ids=position_ids, document_ids=document_ids)
        expected = torch.cat([model(doc_a), model(doc_b)], dim=1)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)


def test_explicit_causal_mask_equals_fused_causal_path():
    model = _model()
    tokens = torch.randint(0, 256, (2, 9))
    mask = torch.ones(9, 9, dtype=torch.bool).tril().expand(2, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, mask=mask), model(tokens), atol=ATOL, rtol=RTOL)


def test_forward_hidden_times_output_weight_is_forward():
    for builder in (llama3_tiny, qwen3_tiny):  # untied and tied
        model = _model(builder)
        tokens = torch.randint(0, 256, (2, 6))
        with torch.no_grad():
            hidden = model.forward_hidden(tokens)  # [B,S,D]
            assert hidden.shape == (2, 6, 64)
            logits = hidden @ model.output_weight.T
            torch.testing.assert_close(logits, model(tokens), atol=ATOL, rtol=RTOL)


def test_kv_cache_incremental_decoding_equals_full_forward():
    for builder in (llama3_tiny, mistral_tiny):  # mistral_tiny has an 8-token sliding window
        model = _model(builder)
        tokens = torch.randint(0, 256, (2, 14))
        with torch.no_grad():
            full = model(tokens)
            model.setup_caches(batch_size=2, max_seq_len=32)
            steps = [model(tokens[:, :5], input_pos=torch.arange(5))]
            for i in range(5, 14):
                steps.append(model(tokens[:, i : i + 1], input_pos=torch.tensor([i])))
            model.teardown_caches()
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=RTOL)


def test_left_padded_batch_with_cache_matches_unpadded_rows():
    model = _model(qwen3_tiny)
    short = torch.randint(1, 256, (3,))
    long = torch.randint(1, 256, (6,))
    pad = 6 - 3
    batch = torch.stack([torch.cat([torch.zeros(pad, dtype=torch.long), short]), long])  # [2,6]
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[0, :pad] = False
    position_ids = (valid.cumsum(-1) - 1).clamp(min=0)  # pads at 0, real tokens 0..n-1
    cache_len = 10
    with torch.no_grad():
        model.setup_caches(batch_size=2, max_seq_len=cache_len)
        key_valid = torch.zeros(2, cache_len, dtype=torch.bool)
        key_valid[:, :6] = valid
        causal = cache_causal_mask(torch.arange(6), cache_len)  # [S, L]
        mask = causal[None] & key_valid[:, None, :]
        mask[0, :pad] |= torch.eye(6, cache_len, dtype=torch.bool)[:pad]  # pads see themselves only
        prefill = model(batch, position_ids=position_ids, mask=mask, input_pos=torch.arange(6))
        nxt = torch.tensor([[7], [9]])
        key_valid[:, 6] = True
        step_mask = cache_causal_mask(torch.tensor([6]), cache_len)[None] & key_valid[:, None, :]
        step_pos = position_ids[:, -1:] + 1
        step = model(nxt, position_ids=step_pos, mask=step_mask, input_pos=torch.tensor([6]))
        model.teardown_caches()
        ref_short = model(torch.cat([short, torch.tensor([7])])[None])
        ref_long = model(torch.cat([long, torch.tensor([9])])[None])
    torch.testing.assert_close(prefill[0, pad:], ref_short[0, :3], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(step[0, 0], ref_short[0, 3], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(prefill[1], ref_long[0, :6], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(step[1, 0], ref_long[0, 6], atol=ATOL, rtol=RTOL)


def test_meta_build_has_no_storage():
    with torch.device("meta"):
        model = llama3_tiny()
    assert all(p.is_meta for p in model.parameters())
