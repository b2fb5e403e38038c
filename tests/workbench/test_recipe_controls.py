"""The Recipe screen's memory/parallel controls (pure functions): which recipes read which control
(checked against each recipe's CONFIG_SCHEMA and code), the overrides each control writes (every
composed config passes `engine.config.validate` and the recipe's own set-up checks), and how the
memory estimate reacts to each (against hand-computed bytes)."""

from __future__ import annotations

import importlib
import inspect
import shutil

import pytest

from engine.config import apply_overrides, list_builtin_configs, parse_yaml, recipe_from_text, validate
from engine.config.recipe_schema import CONTROL_NAMES
from engine.training import recipe_loop
from engine.training.memory_estimate import ModelShape, TrainingOptions, estimate_memory
from workbench.recipe_options import (
    CHUNKED_CE,
    CONTROLS,
    LINEAR_CE,
    OPTIMIZERS,
    absent_controls,
    as_read_by,
    control_overrides,
    control_value,
    max_nproc,
    parse_nproc,
    recipe_problems,
    training_options,
    unread_controls,
)

TRAINING_RECIPES = ("sft", "dpo", "kd", "grpo", "grpo_async", "reward_model", "ppo")

# A full fine-tune of a small Llama-shaped model with every size given (no model card needed).
FULL = {
    "model": {
        "_component_": "engine.models.llama3.llama3",
        "num_layers": 4,
        "num_heads": 8,
        "num_kv_heads": 2,
        "embed_dim": 512,
        "intermediate_dim": 1536,
        "vocab_size": 32000,
    },
    "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": "demo"},
    "dataset": {"_component_": "engine.data.demo_dataset", "max_seq_len": 512},
    "optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-5, "fused": True},
    "loss": {"_component_": CHUNKED_CE, "num_output_chunks": 8},
    "batch_size": 4,
    "gradient_accumulation_steps": 4,
    "clip_grad_norm": 1.0,
    "dtype": "bf16",
}
SHAPE = ModelShape(num_layers=4, dim=512, vocab_size=32000, intermediate_dim=1536, kv_dim=128, q_dim=512)


def _estimate(cfg: dict, nproc: int = 1, recipe: str = "sft"):
    return estimate_memory(SHAPE, TrainingOptions(**training_options(as_read_by(cfg, recipe), nproc, recipe)))


def _with(cfg: dict, name: str, value, recipe: str = "sft") -> dict:
    return apply_overrides(cfg, control_overrides(name, value, cfg, recipe))


# Which recipe reads which control ------------------------------------------------------------


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_absent_controls_match_what_each_recipe_reads(recipe):
    module = importlib.import_module(f"engine.recipes.{recipe}")
    keys, source = module.CONFIG_SCHEMA.fields, inspect.getsource(module)
    if recipe.startswith("grpo"):  # both GRPO recipes drive the GRPO trainer
        source += inspect.getsource(importlib.import_module("engine.rl.grpo_trainer"))
    absent = unread_controls(recipe)
    assert ("activation_checkpointing" in absent) == ("enable_activation_checkpointing" not in keys)
    assert ("optimizer_in_bwd" in absent) == ("optimizer_in_bwd" not in keys)
    assert ("compile" in absent) == ("compile" not in keys)
    assert ("optimizer" in absent) == ("optimizer" not in keys)
    # Linear CE is a loss the recipe documents; packing needs the packed collate (document_ids).
    assert ("linear_ce" in absent) == ("LinearCrossEntropyLoss" not in keys["loss"].doc)
    assert ("packing" in absent) == ("collate_for(" not in source)
    # Several processes: FSDP recipes; the others refuse a world size above 1 at set-up.
    assert ("nproc" in absent) == ("fsdp" not in keys)
    if "nproc" in absent:
        # every recipe's __init__ starts with recipe_loop.start_recipe, which refuses that world size
        assert "recipe_loop.start_recipe(self, " in source and module.CONFIG_SCHEMA.max_nproc == 1
        assert "schema.world_size_error(recipe.world_size" in inspect.getsource(recipe_loop.start_recipe)
        assert max_nproc(recipe, 8) == 1
    for name, why in absent.items():
        assert name in {c.name for c in CONTROLS} and len(why) > 10
    assert {c.name for c in CONTROLS} == set(CONTROL_NAMES)  # the schema's control names are the screen's


def test_lora_rank_is_absent_for_full_fine_tuning_with_the_reason():
    assert "full fine-tune" in absent_controls(FULL, "sft")["lora_rank"]
    lora = dict(FULL, model=dict(FULL["model"], _component_="engine.models.llama3.lora_llama3", lora_rank=8))
    assert "lora_rank" not in absent_controls(lora, "sft")


def test_nproc_range_is_the_gpus_or_eight_cpu_ranks():
    assert max_nproc("sft", 0) == 8 and max_nproc("sft", 4) == 4 and max_nproc("kd", 4) == 1
    assert parse_nproc("2", "sft", 0) == 2
    for text, recipe, gpus in (
        ("9", "sft", 0),
        ("0", "sft", 0),
        ("3", "sft", 2),
        ("2", "grpo", 8),
        ("x", "sft", 0),
    ):
        with pytest.raises(ValueError, match=r"^processes: .* use 1\.\.\d"):
            parse_nproc(text, recipe, gpus)


# Overrides ------------------------------------------------------------------------------------


def test_linear_ce_swaps_the_loss_component_and_keeps_valid_arguments():
    on = _with(FULL, "linear_ce", True)
    assert on["loss"] == {"_component_": LINEAR_CE}  # num_output_chunks is not an LCE argument
    assert control_value("linear_ce", on) is True and validate(on, recipe="sft") == []
    # Turning it off again gives back the loaded node with its own arguments.
    assert _with(FULL, "linear_ce", False)["loss"] == FULL["loss"]
    # SFT's default loss (no `loss` key) is linear CE; off writes the chunked CE component.
    no_loss = {k: v for k, v in FULL.items() if k != "loss"}
    assert control_value("linear_ce", no_loss, "sft") is True
    assert _with(no_loss, "linear_ce", False)["loss"] == {"_component_": CHUNKED_CE}


@pytest.mark.parametrize("choice", list(OPTIMIZERS))
def test_optimizer_choice_maps_to_real_components_and_drops_foreign_arguments(choice):
    cfg = _with(FULL, "optimizer", choice)
    assert cfg["optimizer"]["_component_"] == OPTIMIZERS[choice][1]
    assert cfg["optimizer"]["lr"] == 2e-5
    assert ("fused" in cfg["optimizer"]) == (choice == "adamw")  # torchao's AdamW has no `fused`
    assert control_value("optimizer", cfg) == choice
    assert validate(cfg, recipe="sft") == []


def test_optimizer_in_backward_sets_accumulation_and_clipping_the_recipe_needs():
    from engine.config import ConfigError
    from engine.training.optimizer_in_backward import check_optimizer_in_backward_allowed

    # The loaded config (accumulation 4, clipping 1.0) is refused by the recipe's own check...
    with pytest.raises(ConfigError):
        check_optimizer_in_backward_allowed(gradient_accumulation_steps=4, clip_grad_norm=1.0)
    assert any(
        "gradient_accumulation_steps" in p for p in recipe_problems(dict(FULL, optimizer_in_bwd=True), "sft")
    )
    # ...the control writes a config it accepts.
    on = _with(FULL, "optimizer_in_bwd", True)
    assert on["optimizer_in_bwd"] is True and on["gradient_accumulation_steps"] == 1
    assert on["clip_grad_norm"] is None
    check_optimizer_in_backward_allowed(gradient_accumulation_steps=1, clip_grad_norm=None)
    assert recipe_problems(on, "sft") == []


def test_packing_sets_every_source_of_a_mix_and_needs_a_pack_length():
    mix = dict(
        FULL,
        dataset={
            "_component_": "engine.data.mix",
            "datasets": [
                {"_component_": "engine.data.demo_dataset", "max_seq_len": 256},
                {"_component_": "engine.data.demo_dataset"},
            ],
            "weights": [1, 1],
        },
    )
    packed = _with(mix, "packing", True)
    assert [d["packed"] for d in packed["dataset"]["datasets"]] == [True, True]
    assert control_value("packing", packed) is True and control_value("packing", mix) is False
    assert recipe_problems(packed, "sft") == [
        "dataset.datasets.1.max_seq_len: packing needs the pack length — set it (e.g. 2048) or packed=false"
    ]


def test_bad_lora_rank_is_one_line():
    with pytest.raises(ValueError, match="LoRA rank: '0' is not a positive integer"):
        control_overrides("lora_rank", "0", FULL)


def _variants(cfg: dict, recipe: str):
    """(name, overrides) for every value of every control this config offers, and all at once."""
    absent = absent_controls(cfg, recipe)
    values = {
        "activation_checkpointing": (True, False),
        "optimizer_in_bwd": (True, False),
        "linear_ce": (True, False),
        "compile": (True, False),
        "packing": (True, False),
        "optimizer": tuple(OPTIMIZERS),
        "lora_rank": (4, 64),
    }
    everything: list[str] = []
    for name, options in values.items():
        if name in absent:
            continue
        for value in options:
            ovs = control_overrides(name, value, cfg, recipe)
            yield f"{name}={value}", ovs
        on = {"optimizer": "adamw8bit", "lora_rank": 64}.get(name, options[0])
        everything += control_overrides(name, on, cfg, recipe)
    yield "all on", everything


BUILTIN = [c for c in list_builtin_configs() if recipe_from_text(c.path.read_text()) in TRAINING_RECIPES]


@pytest.mark.parametrize("config", BUILTIN, ids=[c.name for c in BUILTIN])
def test_every_control_on_every_builtin_config_validates(config):
    """Each composed YAML passes `tunebench validate`'s checks and the recipe's own set-up checks."""
    text = config.path.read_text()
    recipe = recipe_from_text(text)
    base = dict(parse_yaml(text), output_dir="/tmp/tunebench-test")  # the launcher sets output_dir
    has_compiler = bool(shutil.which("c++") or shutil.which("g++"))
    for label, ovs in _variants(base, recipe):
        cfg = apply_overrides(base, ovs)
        assert [str(p) for p in validate(cfg, recipe=recipe)] == [], (config.name, label)
        problems = recipe_problems(cfg, recipe, 1, device_count=0)
        if not has_compiler:  # torchao's low-bit AdamW on CPU needs one (said in one line)
            problems = [p for p in problems if "C++ compiler" not in p]
        assert problems == [], (config.name, label)


# The estimate reacts to each control ---------------------------------------------------------


def test_optimizer_in_backward_lowers_gradients_to_the_largest_parameter():
    off, on = _estimate(FULL), _estimate(_with(FULL, "optimizer_in_bwd", True))
    assert off.gradients_bytes == SHAPE.num_params * 2  # bf16 gradient per parameter
    assert on.gradients_bytes == 32000 * 512 * 2  # only the embedding's gradient at a time
    assert (on.weights_bytes, on.optimizer_bytes) == (off.weights_bytes, off.optimizer_bytes)


def test_linear_ce_lowers_activations_by_the_logits_it_never_builds():
    off, on = _estimate(FULL), _estimate(_with(FULL, "linear_ce", True))
    tokens = 4 * 512  # batch x max_seq_len
    # Logits [B*S, V] in bf16 + the fp32 upcast + its gradient, vs one 1024-token chunk of them.
    assert off.activations_bytes - on.activations_bytes == (tokens - 1024) * 32000 * (2 + 4 + 4)


def test_low_bit_optimizers_lower_optimizer_state():
    n = SHAPE.num_params
    state = {c: _estimate(_with(FULL, "optimizer", c)).optimizer_bytes for c in OPTIMIZERS}
    torch_adamw = n * 2 * 2  # exp_avg + exp_avg_sq at bf16
    assert state["adamw"] == torch_adamw
    assert state["adamw8bit"] == pytest.approx(n * (2 + 8 / 256))
    assert state["adamw4bit"] == pytest.approx(n * (1 + 8 / 128))
    assert state["adamw4bit"] < state["adamw8bit"] < state["adamw"]


def test_activation_checkpointing_lowers_activations():
    off, on = _estimate(FULL), _estimate(_with(FULL, "activation_checkpointing", True))
    assert on.activations_bytes < off.activations_bytes
    # Only each layer's input [B, S, D] is kept, plus one layer being recomputed.
    tokens, logits = 4 * 512, 4 * 512 * 32000 * 10
    per_layer = (off.activations_bytes - logits) / 4
    assert on.activations_bytes == pytest.approx(4 * tokens * 512 * 2 + per_layer + logits)
    every_2 = _estimate(dict(_with(FULL, "activation_checkpointing", True), ac_every_k=2))
    assert on.activations_bytes < every_2.activations_bytes < off.activations_bytes


def test_higher_lora_rank_raises_the_estimate():
    lora = dict(FULL, model=dict(FULL["model"], _component_="engine.models.llama3.lora_llama3", lora_rank=8))
    r8, r64 = _estimate(lora), _estimate(_with(lora, "lora_rank", 64))
    assert r64.trainable_params == 8 * r8.trainable_params
    assert r64.total_bytes > r8.total_bytes
    assert r64.gradients_bytes == 8 * r8.gradients_bytes and r64.optimizer_bytes == 8 * r8.optimizer_bytes


def test_two_processes_halve_weights_gradients_and_state_per_rank():
    one, two = _estimate(FULL, 1), _estimate(FULL, 2)
    for part in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
        assert getattr(two, part) == getattr(one, part) / 2, part
    assert two.activations_bytes == one.activations_bytes  # the batch is per rank
    # A one-process recipe estimates one rank whatever the form says.
    assert _estimate(FULL, 2, recipe="kd").weights_bytes == one.weights_bytes


def test_packing_and_compile_leave_the_estimate_unchanged_and_say_so():
    base = _estimate(FULL)
    for name in ("packing", "compile"):
        est = _estimate(_with(FULL, name, True))
        assert est.total_bytes == base.total_bytes
        assert f"{name}: speed option; memory unchanged" in est.notes


def test_options_a_recipe_does_not_read_do_not_move_its_estimate():
    dpo = dict(FULL, loss={"_component_": "engine.modules.loss.DPOLoss"}, optimizer_in_bwd=True)
    assert _estimate(dpo, recipe="dpo").gradients_bytes == SHAPE.num_params * 2
