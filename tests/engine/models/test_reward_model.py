"""Reward models equal transformers' `*ForSequenceClassification` on the same weights (fp32 rewards,
max abs <= 1e-5), load and save state-dict invariant, and build from any family's decoder."""

from __future__ import annotations

import json

import pytest
import torch

from engine.checkpoint import save_pretrained
from engine.models import from_pretrained
from engine.models.hf_config import num_labels_of
from engine.models.reward import reward_from_pretrained, reward_model
from engine.modules.score_decoder import ScoreDecoder, last_non_pad_index, sequence_scores

from .hf_reference import hf_config, hf_model

pytest.importorskip("transformers")

ATOL = 1e-5
PAD = 0
CLASSIFIERS = {"llama3": "LlamaForSequenceClassification", "qwen2": "Qwen2ForSequenceClassification"}


def _hf_classifier(family: str, seed: int = 0, num_labels: int = 1):
    import transformers

    torch.manual_seed(seed)
    config = hf_config(family, num_labels=num_labels, pad_token_id=PAD)
    model = getattr(transformers, CLASSIFIERS[family])(config).to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _batch():
    """Right- and left-padded rows (PAD = 0) of different lengths."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(1, 128, (3, 10), generator=g)
    tokens[0, 7:] = PAD  # right padding
    tokens[1, :4] = PAD  # left padding
    return tokens


@pytest.mark.parametrize("family", list(CLASSIFIERS))
def test_rewards_match_transformers(family, tmp_path):
    reference = _hf_classifier(family)
    reference.save_pretrained(tmp_path / "rm")
    ours = from_pretrained(tmp_path / "rm")
    assert isinstance(ours, ScoreDecoder) and ours.num_labels == 1
    tokens = _batch()
    mask = tokens != PAD
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = reference(tokens, attention_mask=mask.long(), position_ids=positions).logits  # [B,1]
        # the same attention as transformers: pad keys hidden, each query sees itself
        keep = (mask[:, None, :] & torch.ones(10, 10, dtype=torch.bool).tril()[None]) | torch.eye(
            10, dtype=torch.bool
        )
        values = ours(tokens, position_ids=positions, mask=keep)  # [B,S,1]
    got = sequence_scores(values, last_non_pad_index(tokens, PAD))
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_unpadded_rewards_match_without_a_mask(tmp_path):
    reference = _hf_classifier("llama3", seed=1)
    reference.save_pretrained(tmp_path / "rm")
    ours = from_pretrained(tmp_path / "rm")
    tokens = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(tokens).logits
        got = sequence_scores(ours(tokens), last_non_pad_index(tokens, PAD))
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_last_non_pad_index_follows_transformers():
    tokens = torch.tensor([[5, 6, 0, 0], [0, 0, 7, 8], [0, 0, 0, 0], [1, 2, 3, 4]])
    assert last_non_pad_index(tokens, 0).tolist() == [1, 3, 0, 3]
    assert last_non_pad_index(tokens, None).tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize("family", list(CLASSIFIERS))
def test_save_is_state_dict_invariant_and_transformers_loads_it(family, tmp_path):
    import transformers
    from safetensors.torch import load_file

    reference = _hf_classifier(family, seed=2)
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src")
    for out, like in ((tmp_path / "like", tmp_path / "src"), (tmp_path / "derived", None)):
        save_pretrained(ours, out, like=like)
        a, b = load_file(tmp_path / "src" / "model.safetensors"), load_file(out / "model.safetensors")
        assert sorted(a) == sorted(b)
        for key in a:
            assert torch.equal(a[key], b[key]), key
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == [CLASSIFIERS[family]] and num_labels_of(config) == 1
        reloaded = getattr(transformers, CLASSIFIERS[family]).from_pretrained(out).eval()
        tokens = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(reloaded(tokens).logits, reference(tokens).logits, atol=ATOL, rtol=0)


def test_value_model_from_a_causal_lm_gets_a_fresh_head(tmp_path):
    lm = hf_model("qwen2")  # untied: its lm_head is dropped, the blocks are kept
    lm.save_pretrained(tmp_path / "lm")
    value = reward_from_pretrained(tmp_path / "lm")
    assert value.fresh_score_head and value.score.weight.shape == (1, 64)
    assert 0.005 < value.score.weight.std().item() < 0.05
    plain = from_pretrained(tmp_path / "lm")
    tokens = torch.randint(1, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(value.forward_hidden(tokens), plain.forward_hidden(tokens), atol=0, rtol=0)


def test_builder_wraps_any_family_and_lora():
    from engine.models.llama3 import lora_llama3_tiny
    from engine.models.qwen3 import qwen3_tiny
    from engine.modules.peft import get_adapter_params

    rm = reward_model(qwen3_tiny(), num_labels=1)
    assert rm(torch.randint(0, 256, (2, 7))).shape == (2, 7, 1)
    assert "score.weight" in dict(rm.named_parameters()) and "output.weight" not in rm.state_dict()
    lora = reward_model(lora_llama3_tiny(lora_rank=4))
    assert get_adapter_params(lora)
    with pytest.raises(ValueError, match="num_labels"):
        reward_model(qwen3_tiny(), num_labels=0)
