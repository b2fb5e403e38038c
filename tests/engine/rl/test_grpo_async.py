"""Asynchronous GRPO: replay buffer, generator actor, and the Ray recipe on the digit-successor task.

The Ray tests share one local Ray instance (3 CPUs) started by a module fixture.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from tests.engine.recipes.test_grpo import grpo_config


class _Ro:
    def __init__(self, version):
        self.version = version


def test_replay_buffer_staleness_bound():
    from engine.config import ConfigError
    from engine.rl.buffer import ReplayBuffer

    buf = ReplayBuffer(max_staleness=1, capacity=3)
    for v in (0, 1, 2, 3):
        buf.put(_Ro(v))
    assert buf.dropped == 1 and len(buf) == 3  # capacity dropped version 0
    assert buf.pop(3).version == 2  # version 1 is 2 steps behind step 3: dropped
    assert buf.dropped == 2
    assert buf.pop(3).version == 3 and buf.pop(3) is None
    assert [r.version for r in buf.drain_dropped()] == [0, 1] and buf.drain_dropped() == []
    sync = ReplayBuffer(max_staleness=0)
    sync.put(_Ro(4))
    assert sync.pop(5) is None and sync.dropped == 1
    with pytest.raises(ConfigError, match="max_staleness"):
        ReplayBuffer(max_staleness=-1)


def test_generator_actor_class_equals_in_process_rollout(tmp_path):
    """The actor's code path (outside Ray) gives the synchronous recipe's rollout for the same seed."""
    from engine.recipes.grpo import GRPORecipe
    from engine.rl.actors import RolloutGenerator

    cfg = grpo_config(tmp_path)
    recipe = GRPORecipe(cfg)
    recipe.setup()
    try:
        settings = {
            "group_size": 8,
            "max_new_tokens": 2,
            "temperature": 1.0,
            "stop_tokens": recipe.stop_tokens,
        }
        gen = RolloutGenerator(
            cfg["model"], cfg["tokenizer"], cfg["rewards"], {}, settings, seed=cfg["seed"] + 1
        )
        gen.set_weights(recipe.model.state_dict(), 0)
        prompts, answers = [[1, 5, 13], [1, 9, 13]], ["3", "7"]
        a = recipe.rollout(prompts, answers)
        b = gen.rollout(prompts, answers)
        assert a.completions == b.completions
        torch.testing.assert_close(a.rewards, b.rewards)
    finally:
        recipe.cleanup()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    repo = str(Path(__file__).resolve().parents[3])
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": repo}})  # fmt: skip
    yield ray
    ray.shutdown()


def _run(recipe_cls, cfg, callbacks=()):
    previous = signal.getsignal(signal.SIGTERM)
    recipe = recipe_cls(cfg)
    recipe.step_callbacks = list(callbacks) if hasattr(recipe, "step_callbacks") else None
    try:
        recipe.setup()
        recipe.train()
    finally:
        recipe.cleanup()
        signal.signal(signal.SIGTERM, previous)
    return recipe


def test_bound_zero_equals_synchronous_grpo(local_ray, tmp_path):
    from engine.recipes.grpo import GRPORecipe
    from engine.recipes.grpo_async import AsyncGRPORecipe

    torch.set_num_threads(1)  # the actor runs one thread; same kernels, same bits
    over = {"max_steps_per_epoch": 4}
    sync = _run(GRPORecipe, grpo_config(tmp_path / "sync", **over))
    asyn = _run(AsyncGRPORecipe, grpo_config(tmp_path / "async", num_generators=1, max_staleness=0,
                                             weight_sync_every=1, **over))  # fmt: skip
    assert [h["reward/mean"] for h in asyn.history] == [h["reward/mean"] for h in sync.history]
    assert all(h["staleness"] == 0 for h in asyn.history)
    for (name, a), (_, b) in zip(asyn.model.named_parameters(), sync.model.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow  # ~1.5-2.5 min on the shared 2-core machine
def test_two_generators_learn_and_survive_a_killed_actor(local_ray, tmp_path):
    """2 generators, staleness bound 2: reward rises as in synchronous mode; generator 0 is killed
    after step 3, Ray restarts it, the trainer re-sends weights and the lost request."""
    from engine.recipes.grpo_async import AsyncGRPORecipe

    def kill_once(recipe):
        if recipe.global_step == 3:
            local_ray.kill(recipe.actors[0], no_restart=False)

    cfg = grpo_config(tmp_path, num_generators=2, max_staleness=2, weight_sync_every=1)
    recipe = _run(AsyncGRPORecipe, cfg, [kill_once])
    r = [h["reward/mean"] for h in recipe.history]
    assert len(r) == 30
    start, end = sum(r[:5]) / 5, sum(r[-5:]) / 5
    print(f"async reward first 5 steps {start:.3f}, last 5 steps {end:.3f}; restarts {recipe.actor_restarts}")
    assert end >= 0.4 and end > start + 0.3
    assert recipe.actor_restarts >= 1
    assert max(h["staleness"] for h in recipe.history) <= 2
    assert (tmp_path / "checkpoints" / "step_30" / "model").is_dir()
