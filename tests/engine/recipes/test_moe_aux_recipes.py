"""The MoE load-balancing loss joins the training loss of DPO, KD, GRPO and PPO (SFT: test_sft_moe.py),
weighted by the model's `router_aux_loss_coef`, over the batch's real tokens only, and is logged as
`loss/aux`; a dense model gets neither.

How it is shown: one SGD step (lr 1, no clipping) of each recipe with the coefficient at 0 and at
`COEF`, from the same start on the same batch, so the two runs' weights differ by exactly
`COEF * grad(load balancing)`; that gradient is computed here by hand on a copy of the starting model,
from the tokens of the policy's one training forward and a padding mask built from the batch's row
lengths. The tiny Qwen3-MoE preset's sizes, on the 16-symbol digit vocabulary, CPU."""

from __future__ import annotations

import copy
import signal

import pytest
import torch

from engine.models.qwen3_moe import SIZES

COEF = 0.5
MOE = {"_component_": "engine.models.qwen3_moe.qwen3_moe", **SIZES["qwen3_moe_tiny"], "vocab_size": 16,
       "max_seq_len": 32}  # fmt: skip
DENSE = {
    "_component_": "engine.models.llama3.llama3", "vocab_size": 16, "num_layers": 2, "num_heads": 2,
    "num_kv_heads": 1, "embed_dim": 32, "intermediate_dim": 64, "max_seq_len": 32, "rope_base": 10000.0,
}  # fmt: skip
SGD = {"_component_": "torch.optim.SGD", "lr": 1.0}
TOKENIZER = {"_component_": "engine.rl.toy_task.DigitTokenizer"}
COMMON = {"seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None, "optimizer": SGD,
          "epochs": 1, "max_steps_per_epoch": 1, "save_every_n_steps": None, "keep_last_n_checkpoints": 1}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _pairs(n, distractors):
    return {"_component_": "engine.rl.toy_preferences.digit_preference_dataset", "n": n,
            "distractors": distractors, "seed": distractors}  # fmt: skip


def dpo(out, model):
    from engine.recipes.dpo import DPORecipe, check_config

    cfg = {**COMMON, "output_dir": str(out), "model": model, "tokenizer": TOKENIZER, "batch_size": 8,
           "dataset": [_pairs(8, 0), _pairs(8, 3)],  # prompts of 2 and 5 tokens: padded batches
           "loss": {"_component_": "engine.modules.loss.DPOLoss", "beta": 0.1}}  # fmt: skip
    return DPORecipe, check_config, cfg


def kd(out, model):
    from engine.recipes.kd import KDRecipe, check_config

    unpaired = {"_component_": "engine.rl.toy_preferences.digit_unpaired_dataset", "n": 8}  # token/label rows
    cfg = {**COMMON, "output_dir": str(out), "model": model, "teacher_model": dict(DENSE),
           "teacher_checkpoint_dir": None, "tokenizer": TOKENIZER, "batch_size": 8,
           "dataset": [{**unpaired, "distractors": 0}, {**unpaired, "distractors": 3, "seed": 1}],
           "loss": {"_component_": "engine.modules.loss.KDLoss", "kd_ratio": 0.5}}  # fmt: skip
    return KDRecipe, check_config, cfg


_ROLLOUTS = {
    "dataset": {"_component_": "engine.rl.toy_task.digit_successor_dataset", "n": 16},
    "rewards": {"correct": {"_component_": "engine.rl.toy_task.digit_successor_reward"}},
    "max_new_tokens": 3,
    "temperature": 1.0,
    "ppo_epochs": 1,
    "stop_tokens": [3, 4, 5, 6, 7, 8, 9],
}  # digits 0-6 end a completion too: rows of 1-3 tokens


def grpo(out, model):
    from engine.recipes.grpo import GRPORecipe, check_config

    cfg = {**COMMON, **_ROLLOUTS, "output_dir": str(out), "model": model, "tokenizer": TOKENIZER,
           "batch_size": 2, "group_size": 4, "minibatch_size": 8,
           "loss": {"_component_": "engine.modules.loss.GRPOLoss", "kl_coeff": 0.0}}  # fmt: skip
    return GRPORecipe, check_config, cfg


def ppo(out, model):
    from engine.recipes.ppo import PPORecipe, check_config

    cfg = {**COMMON, **_ROLLOUTS, "output_dir": str(out), "model": model, "tokenizer": TOKENIZER,
           "value_model": {"_component_": "engine.models.reward.reward_model", "decoder": dict(DENSE)},
           "batch_size": 2, "num_samples": 4, "minibatch_size": 8, "kl_target": None, "clip_grad_norm": None,
           "loss": {"_component_": "engine.modules.loss.PPOLoss"}}  # fmt: skip
    return PPORecipe, check_config, cfg


def _train(make, out, model):
    """Set up and train (one step) with the policy's grad-enabled forwards and the rollouts recorded.
    Returns `(recipe, starting policy copy, [(args, kwargs)], [rollout])`."""
    recipe_cls, check_config, cfg = make(out, model)
    check_config(cfg)
    previous = signal.getsignal(signal.SIGTERM)
    recipe = recipe_cls(cfg)
    calls, rollouts = [], []
    try:
        recipe.setup()
        start = copy.deepcopy(recipe.model)
        recipe.model.register_forward_pre_hook(
            lambda _m, args, kwargs: calls.append((args, kwargs)) if torch.is_grad_enabled() else None,
            with_kwargs=True,
        )
        if hasattr(recipe, "rollout"):
            sample = recipe.rollout
            recipe.rollout = lambda *a: rollouts.append(sample(*a)) or rollouts[-1]
        recipe.train()
    finally:
        recipe.cleanup()
        signal.signal(signal.SIGTERM, previous)
    return recipe, start, calls, rollouts


def _real_tokens(tokens, rollouts):
    """`[B,S]` True on each row's own tokens: rollout rows are prompt + completion long (a sampled
    token may equal the pad id); dataset rows never hold the pad id (0), so there it is `tokens != 0`."""
    if not rollouts:
        return tokens != 0
    ro = rollouts[0]
    prompts, completions = (
        (ro.prompts, ro.completions) if hasattr(ro, "prompts") else (ro["prompts"], ro["completions"])
    )
    lengths = torch.tensor([len(p) + len(c) for p, c in zip(prompts, completions, strict=True)])
    return torch.arange(tokens.shape[1])[None, :] < lengths[:, None]


@pytest.mark.parametrize("make", [dpo, kd, grpo, ppo], ids=["dpo", "kd", "grpo", "ppo"])
def test_load_balancing_joins_the_loss_over_real_tokens(make, tmp_path):
    from engine.modules.moe import moe_aux_loss

    off, start, _, _ = _train(make, tmp_path / "off", {**MOE, "router_aux_loss_coef": 0.0})
    on, _, calls, rollouts = _train(make, tmp_path / "on", {**MOE, "router_aux_loss_coef": COEF})
    (args, kwargs), *others = calls
    assert not others  # one optimizer step, one training forward of the policy
    tokens = args[0]
    real = _real_tokens(tokens, rollouts)
    assert not real.all()  # the batch has padding to leave out
    # by hand: the load-balancing loss of the starting model on that forward, over the real tokens
    # (and, to show the check tells them apart, over every position)
    grads = {}
    for name, mask in (("real", real), ("all", None)):
        model = copy.deepcopy(start)
        model(*args, **kwargs)
        balance, _ = moe_aux_loss(model, mask=mask)
        (COEF * balance).backward()
        grads[name] = {
            n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()
        }
        if mask is not None:
            expected_aux = balance.item()
    moved_off, moved_on = dict(off.model.named_parameters()), dict(on.model.named_parameters())
    apart = 0.0
    for name, want in grads["real"].items():
        # SGD lr 1: w_off - w_on = COEF * grad(balance); the main loss's gradient is the same in both
        torch.testing.assert_close(moved_off[name] - moved_on[name], want, rtol=1e-4, atol=2e-6, msg=name)
        apart = max(apart, (want - grads["all"][name]).abs().max().item())
    assert apart > 1e-4  # 50x the tolerance: counting the padding would have failed the check above
    assert grads["real"]["layers.0.mlp.router.weight"].abs().sum() > 0
    assert on.history[0]["loss/aux"] == pytest.approx(expected_aux, rel=1e-5)  # logged unweighted
    assert off.history[0]["loss"] == pytest.approx(
        on.history[0]["loss"], rel=1e-6
    )  # `loss`: the recipe's own


@pytest.mark.parametrize("make", [dpo, kd, grpo, ppo], ids=["dpo", "kd", "grpo", "ppo"])
def test_a_dense_model_logs_no_aux_loss(make, tmp_path):
    recipe, _, _, _ = _train(make, tmp_path, dict(DENSE))
    assert "loss/aux" not in recipe.history[0] and "loss" in recipe.history[0]
