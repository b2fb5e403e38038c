"""GRPO, asynchronous on Ray: generator actors sample while the trainer trains.

    python -m engine.recipes.grpo_async --config configs/demo/digit_successor_grpo_async.yaml
    python -m engine.recipes.grpo_async --config configs/demo/digit_successor_grpo_async.yaml ray_address=auto

`num_generators` Ray actors each hold a copy of the policy and turn batches of prompts into scored
rollouts (engine.rl.rollout, the same code the synchronous recipe runs). Rollouts go into a replay
buffer; the trainer takes the oldest usable one, trains on it exactly as synchronous GRPO does
(`GRPORecipe.step_on`) and pushes its weights to every generator each `weight_sync_every` steps.

Staleness: a rollout sampled with the weights of step v may train step t only if t - v <=
`max_staleness`; the trainer also refuses to hand out work that would end up staler (so little is
wasted); what still is gets dropped and its prompts are sampled again with newer weights. `max_staleness: 0` (with `weight_sync_every: 1`) generates each
rollout with the current weights only after the previous step: synchronous GRPO, the same numbers
(tested). Larger bounds overlap generation with training (see docs/BENCHMARKS.md).

Ray: without `ray_address` a local Ray instance is started (and stopped at the end); on a cluster
start Ray on each node (`ray start --head` on one, `ray start --address=HEAD:6379` on the others) and
pass `ray_address=auto` (or `HEAD:6379`) so the recipe joins it with `ray.init(address=...)`; the repo
must be importable on every node (same path, or an installed package). A generator whose process dies
is restarted by Ray; the trainer re-sends the weights and the lost request, and logs `actor_restarts`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path

import torch

from engine.config import ConfigError, ConfigProblem, user_prefixes
from engine.config.recipe_schema import Field, Schema
from engine.recipes._entry import recipe_entry
from engine.rl.buffer import ReplayBuffer
from engine.rl.grpo_trainer import GRPO_SCHEMA as _SYNC
from engine.rl.grpo_trainer import GRPOTrainer
from engine.training import recipe_loop


def _staleness_problems(cfg: dict) -> list[ConfigProblem]:
    """A weight sync period the staleness bound allows (otherwise every rollout would be too stale)."""
    staleness, every = cfg["max_staleness"], cfg["weight_sync_every"]
    if every > staleness + 1:
        return [
            ConfigProblem(
                "weight_sync_every",
                f"must be between 1 and max_staleness + 1 = {staleness + 1} (got {every})",
                "otherwise every rollout would be too stale",
            )
        ]
    return []


# GRPO's keys (the trainer is GRPORecipe) and the generators'. Every key this recipe reads.
CONFIG_SCHEMA = Schema(
    {
        **_SYNC.fields,
        "num_generators": Field(
            int, 2, "Ray generator actors sampling rollouts in parallel with the trainer", minimum=1
        ),
        "max_staleness": Field(
            int, 1, "most trainer steps a rollout's weights may lag behind (0: synchronous GRPO)", minimum=0
        ),
        "weight_sync_every": Field(
            int,
            1,
            "push the trainer's weights to the generators every K steps (<= max_staleness + 1)",
            minimum=1,
        ),
        "ray_address": Field(
            str | None,
            None,
            "null: start a local Ray; 'auto' or HOST:PORT: join that cluster (ray.init(address=...))",
        ),
        "generator_num_cpus": Field(float, 1, "CPUs Ray reserves per generator actor", above=0.0),
        "generator_threads": Field(int, 1, "torch threads inside each generator", minimum=1),
        "buffer_capacity": Field(
            int, 64, "rollouts the replay buffer holds at most (oldest dropped first)", minimum=1
        ),
    },
    checks=(*_SYNC.checks, _staleness_problems),
    max_nproc=1,
    nproc_note="the trainer is one process; rollouts scale with num_generators",
    absent=_SYNC.absent,
    call_site_args=_SYNC.call_site_args,
)


class AsyncGRPORecipe(GRPOTrainer):
    """GRPO with Ray generator actors; training, logging and checkpoints are `GRPOTrainer`'s.

    Raises ConfigError for bad staleness/sync settings or an unreachable Ray cluster.
    """

    schema = CONFIG_SCHEMA

    def __init__(self, cfg: dict, *, dist_info=None) -> None:
        super().__init__(cfg, dist_info=dist_info)  # checks cfg against `schema` (this module's)
        cfg = self.cfg
        self.num_generators = cfg["num_generators"]
        self.max_staleness = cfg["max_staleness"]
        self.sync_every = cfg["weight_sync_every"]
        self.buffer = ReplayBuffer(self.max_staleness, int(cfg["buffer_capacity"]))
        self.actor_restarts = 0
        self.step_callbacks: list = []  # called with the recipe after each step (tests inject faults)
        self._started_ray = False

    # ------------------------------------------------------------------------------------ Ray
    def setup(self) -> None:
        super().setup()
        import ray

        from engine.rl.actors import remote_generator_class

        address = self.cfg["ray_address"]
        if not ray.is_initialized():
            repo = str(Path(__file__).resolve().parents[2])
            env = {"PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)}
            try:
                if address:
                    ray.init(address=str(address), runtime_env={"env_vars": env}, log_to_driver=False)
                else:
                    cpus = max(
                        os.cpu_count() or 1,
                        int(self.num_generators * float(self.cfg["generator_num_cpus"])),
                    )
                    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                             runtime_env={"env_vars": env})  # fmt: skip
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(
                    f"cannot join Ray at {address!r} ({str(exc).splitlines()[0]})",
                    hint="start it with `ray start --head` or set ray_address=null for a local instance",
                    field="ray_address",
                ) from None
            self._started_ray = True
        actor_cls = remote_generator_class(float(self.cfg["generator_num_cpus"]))
        tok_node = dict(self.cfg["tokenizer"])
        if str(tok_node.get("path")) == "demo":
            from engine.training.model_setup import resolve_model_dir

            tok_node["path"] = str(resolve_model_dir("demo"))
        settings = {
            "group_size": self.group_size, "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
            "top_k": self.cfg["top_k"], "top_p": self.cfg["top_p"], "stop_tokens": self.stop_tokens,
        }  # fmt: skip
        self.actors = [
            actor_cls.remote(
                self.cfg["model"],
                tok_node,
                self.reward_nodes,
                self.reward_weights,
                settings,
                self.seed + 1 + 1000 * i,
                user_prefixes(),  # the user's allow-list widening (never the config's)
                int(self.cfg["generator_threads"]),
            )  # fmt: skip
            for i in range(self.num_generators)
        ]
        self.actor_version = [-1] * self.num_generators
        self._full_pushed = [False] * self.num_generators
        self.push_weights()
        # Wait until every generator is built and holds the weights (start-up errors surface here).
        ray.get([a.get_version.remote() for a in self.actors])

    def _state(self, full: bool) -> dict[str, torch.Tensor]:
        """CPU copies of the policy's weights: all of them, or only the trained ones (LoRA pushes)."""
        if full or not self.is_lora:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        return {
            k: v.detach().to("cpu", copy=True) for k, v in self.model.named_parameters() if v.requires_grad
        }

    def push_weights(self, only: list[int] | None = None) -> None:
        """Send the current weights (version = global_step) to the generators (queued behind their work)."""
        import ray

        refs = {}
        for i in only if only is not None else range(self.num_generators):
            full = not self._full_pushed[i]
            if full not in refs:
                refs[full] = ray.put(self._state(full))
            self.actors[i].set_weights.remote(refs[full], self.global_step)
            self._full_pushed[i] = True
            self.actor_version[i] = self.global_step

    # ------------------------------------------------------------------------------------ loop
    def _prompt_batches(self):
        """`(epoch, index_in_epoch, batch)` from the current data position to the run's end."""
        epoch, skip = self.epoch, self.batches_in_epoch
        while epoch < self.epochs:
            self.sampler.set_epoch(epoch, skip=skip)
            for i, batch in enumerate(self.loader, start=skip):
                if i >= self.steps_per_epoch:
                    break
                yield epoch, i, batch
            epoch, skip = epoch + 1, 0

    def train(self) -> int:
        """Run to `total_steps` trained steps (0), or to a SIGTERM (checkpoint, 0)."""
        import ray
        from ray.exceptions import RayActorError

        log = self.logger
        log.set_progress(self.global_step, self.total_steps)
        batches = self._prompt_batches()
        requeued: deque = deque()
        inflight: dict = {}  # ObjectRef -> (actor index, (epoch, index, batch), version pushed before it)
        busy: set[int] = set()
        exhausted = False
        wait_time = 0.0
        while self.global_step < self.total_steps:
            # Hand out work to idle generators while the result could still be fresh enough.
            for i in range(self.num_generators):
                if i in busy or exhausted and not requeued:
                    continue
                ahead = len(self.buffer) + len(inflight)
                if self.global_step + ahead - self.actor_version[i] > self.max_staleness:
                    continue
                item = requeued.popleft() if requeued else next(batches, None)
                if item is None:
                    exhausted = True
                    continue
                epoch, index, batch = item
                meta = {"epoch": epoch, "index": index, "batch": batch}
                ref = self.actors[i].rollout.remote(batch["prompts"], batch["answers"], meta)
                inflight[ref] = (i, item, self.actor_version[i])  # the weights it must at least have
                busy.add(i)
            ro = self.buffer.pop(self.global_step)
            for stale in self.buffer.drain_dropped():  # their prompts are sampled again with newer weights
                requeued.append((stale.meta["epoch"], stale.meta["index"], stale.meta["batch"]))
            if ro is None:
                if not inflight:
                    if exhausted and not requeued:
                        break  # the data ran out (stale rollouts were dropped)
                    self.push_weights()  # every generator is too far behind: refresh them
                    continue
                t_wait = time.perf_counter()
                ready, _ = ray.wait(list(inflight), num_returns=1)
                wait_time += time.perf_counter() - t_wait
                i, item, expected = inflight.pop(ready[0])
                busy.discard(i)
                try:
                    result = ray.get(ready[0])
                except RayActorError:
                    result = None
                if result is None or result.version < expected:
                    # Ray restarted the actor (a fresh process with random weights; a push sent while it
                    # was down is lost): re-send the weights and the request.
                    self.actor_restarts += 1
                    log.event(
                        self.global_step, "actor_restart", f"generator {i} died; restarted, request re-sent"
                    )
                    self._full_pushed[i] = False
                    self._wait_alive(i)
                    self.push_weights(only=[i])
                    requeued.appendleft(item)
                else:
                    self.buffer.put(result)
                continue
            t0 = time.perf_counter()
            self.model.train()
            self.epoch, self.batches_in_epoch = ro.meta["epoch"], ro.meta["index"] + 1
            extra = {
                "staleness": float(self.global_step - ro.version), "buffer_dropped": float(self.buffer.dropped),
                "actor_restarts": float(self.actor_restarts), "trainer_wait_time": wait_time,
            }  # fmt: skip
            wait_time = 0.0
            self.step_on(ro, t0, extra)
            if self.global_step % self.sync_every == 0:
                self.push_weights()
            for callback in self.step_callbacks:
                callback(self)
            if recipe_loop.save_or_stop(self):
                return 0
        self.save_checkpoint()
        return 0

    def _wait_alive(self, i: int, timeout_s: float = 120.0) -> None:
        """Block until generator `i` answers again after a restart (RuntimeError after `timeout_s`)."""
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ray.get(self.actors[i].get_version.remote(), timeout=timeout_s)
                return
            except RayActorError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"generator {i} did not come back within {timeout_s:.0f} s") from None
                time.sleep(0.5)

    def cleanup(self) -> None:
        super().cleanup()
        if self._started_ray:
            import ray

            for actor in getattr(self, "actors", []):
                ray.kill(actor, no_restart=True)
            ray.shutdown()


# the config check before anything is built, and `--config FILE [overrides]` (exit codes 0/1/2)
check_config, recipe_main = recipe_entry("grpo_async", AsyncGRPORecipe)


if __name__ == "__main__":
    recipe_main()
