"""Packing and collate: layout invariants, and packed == unpacked per-token loss on a real tiny decoder."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.data import (
    DataError,
    PackedDataset,
    packed_collate,
    padded_collate,
    padded_collate_dpo,
    shifted_labels,
)


class ListDataset(list):
    pad_id = 0
    source_names = ["a", "b"]


def _samples(n=7, vocab=256, seed=0):
    r = random.Random(seed)
    out = []
    for i in range(n):
        length = r.randint(4, 20)
        ids = [r.randrange(1, vocab) for _ in range(length)]
        n_prompt = r.randint(1, length - 2)
        mask = [True] * n_prompt + [False] * (length - n_prompt)
        out.append({"tokens": ids, "labels": shifted_labels(ids, mask), "source_id": i % 2})
    return ListDataset(out)


def test_pack_layout():
    ds = _samples()
    packed = PackedDataset(ds, max_seq_len=32)
    assert all(len(packed[i]["tokens"]) == 32 for i in range(len(packed)))
    # Every document appears whole, in order, with positions from 0 and its own document id.
    docs = []
    for i in range(len(packed)):
        p = packed[i]
        for d in sorted(set(p["document_ids"])):
            idx = [j for j, x in enumerate(p["document_ids"]) if x == d]
            assert idx == list(range(idx[0], idx[-1] + 1))
            assert [p["position_ids"][j] for j in idx] == list(range(len(idx)))
            if p["source_ids"][idx[0]] >= 0:
                docs.append(
                    ([p["tokens"][j] for j in idx], [p["labels"][j] for j in idx], p["source_ids"][idx[0]])
                )
            else:  # the padding run
                assert all(p["tokens"][j] == 0 and p["labels"][j] == -100 for j in idx)
    assert docs == [(s["tokens"], s["labels"], s["source_id"]) for s in ds]
    real = sum(len(s["tokens"]) for s in ds)
    assert packed.efficiency == pytest.approx(real / (32 * len(packed)))


def test_split_across_pack_fills_packs():
    ds = _samples(n=10)
    packed = PackedDataset(ds, max_seq_len=16, split_across_pack=True)
    total = sum(len(s["tokens"]) for s in ds)
    assert len(packed) == -(-total // 16)
    flat = [
        t for i in range(len(packed)) for t, s in zip(packed[i]["tokens"], packed[i]["source_ids"]) if s >= 0
    ]
    assert flat == [t for s in ds for t in s["tokens"]]


def test_too_long_sample_without_split():
    with pytest.raises(DataError, match="sample 0 has 10 tokens, more than max_seq_len=8"):
        PackedDataset(ListDataset([{"tokens": list(range(10)), "labels": [-100] * 10, "source_id": 0}]), 8)


def test_padded_collate_layout():
    ds = _samples(n=3)
    b = padded_collate(list(ds), pad_id=5)
    S = max(len(s["tokens"]) for s in ds)
    assert b["tokens"].shape == (3, S) and b["labels"].shape == (3, S)
    for i, s in enumerate(ds):
        n = len(s["tokens"])
        assert b["tokens"][i, :n].tolist() == s["tokens"] and (b["tokens"][i, n:] == 5).all()
        assert (b["labels"][i, n:] == -100).all() and (b["source_ids"][i, n:] == -1).all()
        assert (b["source_ids"][i, :n] == s["source_id"]).all()
    assert b["position_ids"][0].tolist() == list(range(S))


def test_dpo_collate_concat_layout():
    pairs = [
        {
            "chosen_tokens": [1, 2, 3],
            "chosen_labels": [2, 3, -100],
            "rejected_tokens": [1, 4],
            "rejected_labels": [4, -100],
            "source_id": 0,
        },
        {
            "chosen_tokens": [1, 5],
            "chosen_labels": [5, -100],
            "rejected_tokens": [1, 6, 7, 8],
            "rejected_labels": [6, 7, 8, -100],
            "source_id": 1,
        },
    ]
    b = padded_collate_dpo(pairs, pad_id=0)
    assert b["chosen_tokens"].shape == b["rejected_tokens"].shape == (2, 4)
    both = torch.cat([b["chosen_tokens"], b["rejected_tokens"]])  # [2B, S]
    assert both[3].tolist() == [1, 6, 7, 8] and b["rejected_labels"][0].tolist() == [4, -100, -100, -100]
    assert b["source_ids"].tolist() == [0, 1]
    # True on each sequence's own tokens (the MoE load-balancing loss leaves the rest out)
    assert b["chosen_attention_mask"][1].tolist() == [True, True, False, False]
    assert b["rejected_attention_mask"][1].tolist() == [True, True, True, True]


def _per_token_loss(logits, labels):
    # logits [B,S,V], labels [B,S] already shifted -> losses of the non-ignored positions, in order
    keep = labels != -100
    return F.cross_entropy(logits[keep], labels[keep], reduction="none")


def test_packed_equals_unpacked_loss_on_tiny_decoder():
    from engine.models.llama3 import llama3_tiny

    torch.manual_seed(0)
    model = llama3_tiny().eval()
    ds = _samples(n=7)
    with torch.no_grad():
        # Reference: every sample alone (batch of one, no padding at all).
        ref = torch.cat(
            [_per_token_loss(model(torch.tensor([s["tokens"]])), torch.tensor([s["labels"]])) for s in ds]
        )
        packed = PackedDataset(ds, max_seq_len=40)
        assert len(packed) < len(ds)  # several documents share a pack
        b = packed_collate([packed[i] for i in range(len(packed))])
        logits = model(b["tokens"], position_ids=b["position_ids"], document_ids=b["document_ids"])
        got = _per_token_loss(logits, b["labels"])
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        # The padded (unpacked) batch gives the same losses too.
        pb = padded_collate(list(ds), pad_id=0)
        padded = _per_token_loss(model(pb["tokens"], position_ids=pb["position_ids"]), pb["labels"])
        torch.testing.assert_close(padded, ref, rtol=1e-5, atol=1e-5)
        # Control: without document ids and restarting positions, attention crosses documents.
        wrong = _per_token_loss(model(b["tokens"]), b["labels"])
        assert not torch.allclose(wrong, ref, rtol=1e-3, atol=1e-3)


def test_fast_path_equals_generic_path(tok):
    from engine.data import instruct_dataset

    rows = [{"input": f"question number {i}?", "output": "answer " * (i % 5 + 1)} for i in range(30)]
    ds = instruct_dataset(tok("smollm2"), source=rows, cache=False)
    for i in range(len(ds)):  # numpy sample view == the list sample
        t, lab, s = ds.sample_arrays(i)
        assert (t.tolist(), lab.tolist(), s) == (ds[i]["tokens"], ds[i]["labels"], ds[i]["source_id"])
    fast = PackedDataset(ds, max_seq_len=48)
    generic = PackedDataset(ListDataset([ds[i] for i in range(len(ds))]), max_seq_len=48, pad_id=ds.pad_id)
    assert [fast[i] for i in range(len(fast))] == [generic[i] for i in range(len(generic))]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=2, max_value=30), min_size=1, max_size=12),
    L=st.integers(min_value=30, max_value=64),
    split=st.booleans(),
)
def test_packing_invariants_property(lengths, L, split):
    ds = ListDataset(
        {
            "tokens": [k * 100 + j for j in range(n)],
            "labels": [k * 100 + j + 1 for j in range(n - 1)] + [-100],
            "source_id": k % 2,
        }
        for k, n in enumerate(lengths)
    )
    packed = PackedDataset(ds, max_seq_len=L, split_across_pack=split)
    real = [
        t for i in range(len(packed)) for t, s in zip(packed[i]["tokens"], packed[i]["source_ids"]) if s >= 0
    ]
    assert real == [t for s in ds for t in s["tokens"]]  # every token once, in order
    for i in range(len(packed)):
        p = packed[i]
        assert len(p["tokens"]) == L
        for j in range(L):
            if p["labels"][j] != -100:  # a target is always the next token of the same document
                doc = p["document_ids"][j]
                nxt = p["tokens"][j + 1] if j + 1 < L and p["document_ids"][j + 1] == doc else None
                assert nxt is None and split or p["labels"][j] == nxt
            if j and p["document_ids"][j] == p["document_ids"][j - 1]:
                assert p["position_ids"][j] == p["position_ids"][j - 1] + 1
            else:
                assert p["position_ids"][j] == 0
    if not split:
        assert len(packed) <= len(lengths)


def test_padded_collate_multiple_of():
    ds = _samples(n=3)
    b = padded_collate(list(ds), pad_id=0, pad_to_multiple_of=16)
    assert b["tokens"].shape[1] % 16 == 0 and b["tokens"].shape[1] >= max(len(s["tokens"]) for s in ds)
    assert (b["labels"][:, -1] == -100).all()
