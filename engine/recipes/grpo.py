"""GRPO, synchronous: generate G completions per prompt, score them, train on them, in turn.

    python -m engine.recipes.grpo --config configs/demo/digit_successor_grpo.yaml
    python -m engine.recipes.grpo --config configs/demo/smollm2_135m_lora_grpo.yaml

One step: `batch_size` prompts -> `group_size` sampled completions each (engine.generation, KV cache,
`temperature`, `max_new_tokens`, stop tokens) -> rewards (each component of `rewards`, weighted by
`reward_weights`) -> group-normalised advantages -> log-probs of the completions under the policy
that sampled them ("old") and under the reference -> `ppo_epochs` passes over the rollouts in
minibatches of `minibatch_size` completions, one optimizer step each (GRPOLoss: clipped ratio + k3 KL).
The reference is a frozen copy of the starting model, or the policy with adapters disabled (LoRA).

Logged per step: `reward/mean`, `reward/std`, `rewards/<name>`, `kl`, `clip_fraction`, `ratio`,
`completion_length`, `loss`, `loss/aux` (an MoE policy's load-balancing loss, added to the objective
with `router_aux_loss_coef`, padding left out), `lr`, `grad_norm`, `rollout_tokens_per_sec` (completion tokens per second
of generation), `tokens_per_sec` (prompt + completion tokens of the step's sequences per second of the
whole step: generation, scoring and every PPO pass; the progress line's figure), `step_time`; the first
`num_samples_to_log` completions of every step go to `output_dir/samples.jsonl`. One process (the
asynchronous recipe, `grpo_async`, spreads generation over Ray actors). Exit codes as in SFT.
"""

from __future__ import annotations

import time

from engine.recipes._entry import recipe_entry
from engine.rl.grpo_trainer import GRPO_SCHEMA, GRPOTrainer
from engine.training import recipe_loop

# Every key this recipe reads (declared with the trainer it drives, which grpo_async shares).
CONFIG_SCHEMA = GRPO_SCHEMA


class GRPORecipe(GRPOTrainer):
    """Synchronous GRPO: `setup()`, `train()`, `save_checkpoint()`, `cleanup()` (all but `train` are
    the trainer's).

    Args:
        cfg (dict): resolved config. Raises ConfigError for values that cannot work (named).
    """

    def train(self) -> int:
        """Run to the end (0), to a SIGTERM (checkpoint, 0), or to a NaN loss (`LossIsNaN`)."""
        log = self.logger
        log.set_progress(self.global_step, self.total_steps)
        while self.epoch < self.epochs and self.global_step < self.total_steps:
            self.sampler.set_epoch(self.epoch, skip=self.batches_in_epoch)
            for batch in self.loader:
                if self.batches_in_epoch >= self.steps_per_epoch:
                    break
                t0 = time.perf_counter()
                self.model.train()
                ro = self.rollout(batch["prompts"], batch["answers"])
                self.batches_in_epoch += 1
                self.step_on(ro, t0)
                if self.batches_in_epoch >= self.steps_per_epoch:
                    break
                if recipe_loop.save_or_stop(self):
                    return 0
            if recipe_loop.end_epoch(self):
                return 0
        return 0


# the config check before anything is built, and `--config FILE [overrides]` (exit codes 0/1/2)
check_config, recipe_main = recipe_entry("grpo", GRPORecipe)


if __name__ == "__main__":
    recipe_main()
