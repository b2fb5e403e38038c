"""SFT on mixtures of experts: the load-balancing (and z-) loss joins the training loss with its
coefficients and is logged as `loss/aux`; LoRA on experts trains stacked per-expert adapters (and the
router, by choice) and exports them as PEFT adapters."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from tests.engine.recipes._sft_helpers import run_recipe, tiny_config

MOE = {
    "_component_": "engine.models.qwen3_moe.qwen3_moe",
    "vocab_size": 49152,  # the SmolLM2 tokenizer's
    "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "head_dim": 16,
    "moe_intermediate_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "max_seq_len": 256,
    "router_aux_loss_coef": 0.5, "router_z_loss_coef": 0.01,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_one_step_equals_cross_entropy_plus_weighted_aux_losses(shared_assets, tmp_path):
    """One SGD step (lr 1) of the recipe moves every weight by the gradient of
    `mean token CE + 0.5 * load balancing + 0.01 * z-loss` computed here by hand on the same batch
    (the auxiliary losses over its real tokens only)."""
    from engine.modules.moe import moe_aux_loss
    from engine.recipes.sft import SFTRecipe, check_config

    cfg = tiny_config(
        shared_assets, tmp_path / "run", model=dict(MOE), max_steps_per_epoch=1, batch_size=2,
        optimizer={"_component_": "torch.optim.SGD", "lr": 1.0}, lr_scheduler=None,
    )  # fmt: skip
    cfg["dataset"]["max_seq_len"] = 160  # rows of their own lengths (48 truncates them all alike): padding
    check_config(cfg)
    recipe = SFTRecipe(cfg)
    recipe.setup()
    try:
        reference = copy.deepcopy(recipe.model)
        seen = []
        token_losses = recipe._token_losses
        recipe._token_losses = lambda batch: seen.append(batch) or token_losses(batch)
        recipe.train()
    finally:
        recipe.cleanup()
    (batch,) = seen
    kwargs = {"position_ids": batch.get("position_ids"), "document_ids": batch.get("document_ids")}
    logits = reference(batch["tokens"], **kwargs)
    labels = batch["labels"]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    real = batch["source_ids"] >= 0  # the padding's routing is left out, as transformers does
    assert not real.all()  # rows of different lengths: there is padding to leave out
    balance, z = moe_aux_loss(reference, mask=real)
    (ce + 0.5 * balance + 0.01 * z).backward()
    assert recipe.loss_history and abs(recipe.loss_history[0] - ce.item()) < 1e-5  # `loss` is the CE
    trained = dict(recipe.model.named_parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(trained[name], p.detach() - p.grad, rtol=1e-4, atol=2e-6, msg=name)
    router = reference.layers[0].mlp.router.weight.grad
    assert router.abs().sum() > 0


def test_lora_on_experts_and_router_exports_peft_adapters(
    shared_assets, tmp_path, tunebench_home, monkeypatch
):
    from safetensors.torch import load_file

    from engine.checkpoint.peft import load_adapters
    from engine.tracking import open_db
    from engine.tracking.readers import metric_series
    from engine.tracking.run_rows import create_run

    with open_db() as db:
        run = create_run(db=db, recipe="sft", config_text="{}")
    monkeypatch.setenv("TUNEBENCH_RUN_ID", run.id)
    model = dict(
        MOE, _component_="engine.models.qwen3_moe.lora_qwen3_moe", lora_rank=4, lora_alpha=8.0,
        apply_lora_to_experts=True, train_router=True,
    )  # fmt: skip
    cfg = tiny_config(shared_assets, tmp_path / "run", model=model, max_steps_per_epoch=3)
    torch.manual_seed(0)
    recipe = run_recipe(cfg)
    with open_db() as db:
        aux = metric_series(run.id, "loss/aux", db=db)
    assert [s for s, _ in aux] == [1, 2, 3] and all(0.9 < v < 3.0 for _, v in aux)  # E*sum f*P ~ 1 balanced
    experts = recipe.model.layers[0].mlp.experts
    assert not experts.gate_proj.requires_grad and experts.gate_proj_lora_b.requires_grad
    assert experts.gate_proj_lora_b.abs().sum() > 0  # B started at zero and trained
    assert recipe.model.layers[0].mlp.router.weight.requires_grad
    folder = tmp_path / "run" / "checkpoints" / "step_3" / "model"
    weights = load_file(folder / "adapter_model.safetensors")
    key = "base_model.model.model.layers.1.mlp.experts.7.down_proj.lora_B.weight"
    torch.testing.assert_close(weights[key], recipe.model.layers[1].mlp.experts.down_proj_lora_b[7].detach())
    assert "base_model.model.model.layers.0.mlp.gate.weight" in weights
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["gate"]
    assert {"q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"} == set(config["target_modules"])
    trained = {k: v.clone() for k, v in recipe.model.state_dict().items() if "lora_" in k or "router" in k}
    with torch.no_grad():
        for p in recipe.model.parameters():
            if p.requires_grad:
                p.zero_()
    load_adapters(recipe.model, folder)
    for key, value in trained.items():
        torch.testing.assert_close(recipe.model.state_dict()[key], value, rtol=0, atol=0, msg=key)
