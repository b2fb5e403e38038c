"""Every built-in SFT config opens with its launch line, validates against the recipe's keys, and
builds its model (on `meta`: no memory) with the method its file name promises."""

from pathlib import Path

import pytest
import torch

from engine.config import builtin_config_dir, instantiate, load_config, recipe_from_text, validate

CONFIGS = sorted(
    p for p in Path(builtin_config_dir()).rglob("*.yaml") if recipe_from_text(p.read_text()) == "sft"
)


def test_every_family_and_method_has_a_config():
    names = {f"{p.parent.name}/{p.stem}" for p in CONFIGS}
    for family in ("llama2", "llama3_1", "llama3_2", "qwen2_5", "qwen3", "mistral", "smollm2"):
        for method in ("full", "lora", "qlora"):
            assert any(n.startswith(f"{family}/") and n.endswith(f"_{method}") for n in names), (
                family,
                method,
            )
    assert "demo/smollm2_135m_lora" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_config_validates_and_builds(path):
    rel = f"{path.parent.name}/{path.stem}"
    assert path.read_text().splitlines()[0] == f"# tunebench run sft --config {rel}"
    cfg = load_config(path)
    assert validate(cfg, recipe="sft") == []
    with torch.device("meta"):
        model = instantiate(cfg["model"])
    lora = [n for n, _ in model.named_parameters() if "lora_" in n]
    method = path.stem.rsplit("_", 1)[1]
    assert bool(lora) == (method in ("lora", "qlora"))
    quantized = any(getattr(m, "quantize_base", False) for m in model.modules())
    assert quantized == (method == "qlora")
