"""The SFT recipe in one process on a tiny Llama and the real alpaca-cleaned-1k rows.

Each run is the real recipe (`SFTRecipe.setup()` + `train()`, as `python -m engine.recipes.sft` runs
it); the references are other configurations that must give the same numbers (the full batch for
gradient accumulation, a normal optimizer step for optimizer-in-backward) and the tracker's rows.
"""

import pytest
import torch

from engine.config import ConfigError
from tests.engine.recipes._sft_helpers import run_recipe, tiny_config, trainable_state


@pytest.fixture(autouse=True)
def _one_thread(tunebench_home):
    # Tiny matmuls on a shared 2-core machine: threads only contend. Restored afterwards.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_loss_falls_on_alpaca(shared_assets, tmp_path):
    recipe = run_recipe(tiny_config(shared_assets, tmp_path / "run", max_steps_per_epoch=16))
    losses = recipe.loss_history
    assert len(losses) == 16
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 0.5, losses
    # An epoch-end checkpoint with the model in the Hugging Face layout.
    final = tmp_path / "run" / "checkpoints" / "step_16"
    assert (final / "recipe_state.pt").is_file() and (final / "model" / "model.safetensors").is_file()


# SGD with momentum: the update is linear in the gradient, so weights compare at fp32 rounding (Adam
# divides by sqrt(v) and turns last-bit gradient differences of near-zero entries into lr-sized ones).
SGD = {"_component_": "torch.optim.SGD", "lr": 0.5, "momentum": 0.9}


def test_grad_accumulation_equals_full_batch(shared_assets, tmp_path):
    full = run_recipe(
        tiny_config(shared_assets, tmp_path / "a", batch_size=4, max_steps_per_epoch=4, optimizer=SGD)
    )
    accum = run_recipe(
        tiny_config(
            shared_assets,
            tmp_path / "b",
            batch_size=2,
            gradient_accumulation_steps=2,
            max_steps_per_epoch=4,
            optimizer=SGD,
        )  # fmt: skip
    )
    torch.testing.assert_close(
        torch.tensor(accum.loss_history), torch.tensor(full.loss_history), rtol=1e-5, atol=0
    )
    for (name, a), b in zip(trainable_state(full).items(), trainable_state(accum).values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)


def test_optimizer_in_backward_equals_normal_step(shared_assets, tmp_path):
    normal = run_recipe(tiny_config(shared_assets, tmp_path / "a", max_steps_per_epoch=3, optimizer=SGD))
    in_bwd = run_recipe(
        tiny_config(
            shared_assets, tmp_path / "b", max_steps_per_epoch=3, optimizer=SGD, optimizer_in_bwd=True
        )
    )
    torch.testing.assert_close(
        torch.tensor(in_bwd.loss_history), torch.tensor(normal.loss_history), rtol=1e-5, atol=0
    )
    for (name, a), b in zip(trainable_state(normal).items(), trainable_state(in_bwd).values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)


def test_optimizer_in_backward_refuses_accumulation(shared_assets, tmp_path):
    cfg = tiny_config(shared_assets, tmp_path, optimizer_in_bwd=True, gradient_accumulation_steps=2)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        run_recipe(cfg)


def test_qlora_trains_with_nf4_base_and_exports_peft_adapters(shared_assets, tmp_path):
    from torchao.quantization import NF4Tensor

    from engine.checkpoint.peft import load_adapters

    # NF4 blocks need weights of a multiple of 16,384 elements: 128 x 128 projections.
    model = {
        "_component_": "engine.models.llama3.lora_llama3",
        "vocab_size": 49152, "num_layers": 2, "num_heads": 4, "num_kv_heads": 4, "embed_dim": 128,
        "intermediate_dim": 256, "max_seq_len": 256, "rope_base": 10000.0,
        "lora_attn_modules": ["q_proj", "v_proj"], "lora_rank": 8, "lora_alpha": 16.0, "quantize_base": True,
    }  # fmt: skip
    cfg = tiny_config(
        shared_assets, tmp_path / "run", model=model, max_steps_per_epoch=12, save_merged_model=True
    )
    cfg["optimizer"]["lr"] = 1e-2
    recipe = run_recipe(cfg)
    # The merged model (NF4 base dequantised + adapters folded in) loads in transformers with our logits.
    transformers = pytest.importorskip("transformers")
    merged = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "run" / "merged", dtype=torch.float32
    )
    tokens = torch.randint(0, 49152, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        recipe.model.eval()
        torch.testing.assert_close(merged.eval()(tokens).logits, recipe.model(tokens), rtol=1e-4, atol=1e-4)
    q_proj = recipe.model.layers[0].attn.q_proj
    assert isinstance(q_proj.weight, NF4Tensor) and not q_proj.weight.requires_grad
    losses = recipe.loss_history
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05, losses
    # The checkpoint holds PEFT adapters equal to the trained ones.
    adapters = tmp_path / "run" / "checkpoints" / "step_12" / "model"
    assert (adapters / "adapter_config.json").is_file()
    trained = {k: v.clone() for k, v in recipe.model.state_dict().items() if "lora_" in k}
    with torch.no_grad():
        for name, p in recipe.model.named_parameters():
            if "lora_" in name:
                p.zero_()
    load_adapters(recipe.model, adapters)
    for key, value in trained.items():
        torch.testing.assert_close(recipe.model.state_dict()[key], value, rtol=0, atol=0)


def test_mix_logs_loss_per_source_and_validation(shared_assets, tmp_path, tunebench_home, monkeypatch):
    from engine.tracking import open_db
    from engine.tracking.readers import metric_names, metric_series
    from engine.tracking.run_rows import create_run

    with open_db() as db:
        run = create_run(db=db, recipe="sft", config_text="{}")
    monkeypatch.setenv("TUNEBENCH_RUN_ID", run.id)
    part = tiny_config(shared_assets, tmp_path)["dataset"]
    mix = [dict(part, name="alpaca_a"), dict(part, name="alpaca_b", train_on_input=True)]
    cfg = tiny_config(
        shared_assets, tmp_path / "run", dataset=mix, max_steps_per_epoch=4,
        validation={"fraction": 0.02, "every_n_steps": 2, "max_batches": 2},
    )  # fmt: skip
    run_recipe(cfg)
    with open_db() as db:
        names = set(metric_names(run.id, db=db))
        val = metric_series(run.id, "val_loss", db=db)
        loss = metric_series(run.id, "loss", db=db)
    assert {
        "loss/alpaca_a",
        "loss/alpaca_b",
        "val_loss",
        "grad_norm",
        "tokens_per_sec",
        "mem_peak_gb",
    } <= names
    assert [s for s, _ in val] == [2, 4]
    assert [s for s, _ in loss] == [1, 2, 3, 4]


def test_packed_batches_with_activation_checkpointing_match_without(shared_assets, tmp_path):
    # Packed 96-token sequences (block-causal attention through document_ids); checkpointing every
    # block recomputes the same forward, so losses and weights must not move.
    over = {
        "dataset.packed": True,
        "dataset.max_seq_len": 96,
        "batch_size": 2,
        "max_steps_per_epoch": 3,
        "optimizer": SGD,
    }
    plain = run_recipe(tiny_config(shared_assets, tmp_path / "a", **over))
    ac = run_recipe(tiny_config(shared_assets, tmp_path / "b", enable_activation_checkpointing=True, **over))
    from engine.training.activation_checkpointing import is_checkpointed

    assert all(is_checkpointed(block) for block in ac.model.layers)
    assert not any(is_checkpointed(block) for block in plain.model.layers)
    torch.testing.assert_close(
        torch.tensor(ac.loss_history), torch.tensor(plain.loss_history), rtol=1e-6, atol=0
    )
    for (name, a), b in zip(trainable_state(plain).items(), trainable_state(ac).values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7, msg=name)


def test_neftune_noise_reaches_training_only(shared_assets, tmp_path):
    """`neftune_alpha: 5` reaches the decoder: the first step's training loss (noisy embeddings, same
    weights and batch) moves off the plain run's by a little; in eval mode the trained model's logits
    are the same with the alpha set or cleared (no noise outside training)."""
    plain = run_recipe(tiny_config(shared_assets, tmp_path / "a", max_steps_per_epoch=2, optimizer=SGD))
    noisy = run_recipe(
        tiny_config(shared_assets, tmp_path / "b", max_steps_per_epoch=2, optimizer=SGD, neftune_alpha=5.0)
    )
    assert noisy.model.neftune_alpha == 5.0 and plain.model.neftune_alpha == 0.0
    first_plain, first_noisy = plain.loss_history[0], noisy.loss_history[0]
    assert first_noisy != first_plain and abs(first_noisy - first_plain) < 0.05 * first_plain
    tokens = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    model = noisy.model.eval()
    with torch.no_grad():
        with_alpha = model(tokens)
        model.neftune_alpha = 0.0
        torch.testing.assert_close(model(tokens), with_alpha, rtol=0, atol=0)
