"""NEFTune against transformers' own hook (`transformers.integrations.neftune`) on the same weights and
the same generator seed, and through the SFT/KD recipes and their config checks."""

from __future__ import annotations

import pytest
import torch

from engine.config import validate
from engine.models import from_pretrained
from engine.modules.neftune import add_neftune_noise, neftune_magnitude, set_neftune_alpha
from tests.engine.models.hf_reference import hf_model

transformers = pytest.importorskip("transformers")
from transformers.integrations.neftune import activate_neftune, neftune_post_forward_hook  # noqa: E402

TOKENS = torch.randint(0, 128, (3, 11), generator=torch.Generator().manual_seed(0))


def test_noise_equals_transformers_hook_at_the_same_seed():
    """The same draws as transformers' hook (bound alpha/sqrt(S*D): theirs is computed in float32,
    ours in float64, so the values agree to float32 rounding of the bound, rtol 1e-6)."""
    embeddings = torch.randn(3, 11, 64)
    module = torch.nn.Embedding(4, 64).train()
    module.neftune_noise_alpha = 5.0
    torch.manual_seed(7)
    theirs = neftune_post_forward_hook(module, None, embeddings)
    torch.manual_seed(7)
    ours = add_neftune_noise(embeddings, 5.0)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    bound = neftune_magnitude(5.0, 11, 64)
    assert 0.9 * bound < (ours - embeddings).abs().max() <= bound * (1 + 1e-6)


def test_decoder_with_neftune_equals_transformers_model(tmp_path):
    """Our Llama (alpha 5, training mode) gives transformers' logits with `activate_neftune(model, 5)`
    at the same seed; in eval mode both give the clean logits; alpha 0 is off."""
    reference = hf_model("llama3")
    reference.save_pretrained(tmp_path / "base")
    ours = from_pretrained(tmp_path / "base")
    assert set_neftune_alpha(ours, 5.0) == 1
    activate_neftune(reference, 5.0)
    ours.train(), reference.train()
    with torch.no_grad():
        torch.manual_seed(3)
        expected = reference(TOKENS).logits
        torch.manual_seed(3)
        noisy = ours(TOKENS)
        torch.testing.assert_close(noisy, expected, atol=1e-5, rtol=1e-5)
        ours.eval(), reference.eval()
        clean = ours(TOKENS)
        torch.testing.assert_close(clean, reference(TOKENS).logits, atol=1e-5, rtol=1e-5)
        assert (noisy - clean).abs().max() > 1e-3  # the noise was there in training mode
        set_neftune_alpha(ours, 0.0)
        ours.train()
        torch.testing.assert_close(ours(TOKENS), clean)


def _config(**keys) -> dict:
    """A complete tiny SFT config (nothing missing, so the checks between keys run) with `keys` set."""
    return {
        "model": {"_component_": "engine.models.llama3.llama3_tiny"},
        "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": "tok"},
        "dataset": {"_component_": "engine.data.instruct_dataset", "source": "rows.json"},
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-4},
        **keys,
    }


def test_config_refuses_neftune_with_split_activations():
    base = _config(neftune_alpha=5.0)
    problems = [str(p) for p in validate({**base, "tensor_parallel_dim": 2}, recipe="sft")]
    assert any(p.startswith("neftune_alpha: ") and "tensor_parallel_dim=2" in p for p in problems), problems
    problems = [str(p) for p in validate({**base, "neftune_alpha": -1.0}, recipe="sft")]
    assert any(p.startswith("neftune_alpha") and ">= 0" in p for p in problems), problems
    assert not any("neftune" in str(p) for p in validate(base, recipe="sft"))
