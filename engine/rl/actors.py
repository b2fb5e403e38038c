"""Generator actors for asynchronous GRPO: each holds a copy of the policy and produces rollouts.

`RolloutGenerator` is a plain class (unit-testable in-process); `remote_generator_class()` wraps it as
a Ray actor that Ray restarts when its process dies (`max_restarts=-1`); the trainer then pushes the
current weights again and re-submits the lost request.
"""

from __future__ import annotations

import torch

from engine.config import allow_components, instantiate
from engine.rl.rollout import Rollout, generate_and_score


class RolloutGenerator:
    """A policy copy for sampling.

    Args:
        model_node (dict): the `_component_` model builder (built with random weights; the trainer
            pushes the real ones before the first request).
        tokenizer_node (dict): the tokenizer component (paths resolved).
        reward_nodes, reward_weights (dict): as in the GRPO config.
        settings (dict): group_size, max_new_tokens, temperature, top_k, top_p, stop_tokens.
        seed (int): this generator's sampling seed.
        allowed (list[str]): the trainer's user-granted component prefixes (`engine.config.user_prefixes`:
            `--allow-component`, `TUNEBENCH_ALLOW`, settings.yaml), e.g. a package of user reward functions.
        num_threads (int): torch threads in this process (default 1).
    """

    def __init__(self, model_node: dict, tokenizer_node: dict, reward_nodes: dict, reward_weights: dict,
                 settings: dict, seed: int, allowed: list[str] | None = None, num_threads: int = 1) -> None:  # fmt: skip
        torch.set_num_threads(num_threads)
        if allowed:
            allow_components(allowed, source="the GRPO trainer")
        self.model = instantiate(model_node)
        self.model.eval().requires_grad_(False)
        self.tokenizer = instantiate(tokenizer_node)
        self.reward_nodes, self.reward_weights = reward_nodes, reward_weights
        self.settings = dict(settings)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = -1  # no weights yet

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Load `state` (all parameters, or only the trained ones after the first push); returns `version`."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected:
            raise KeyError(f"weights push: unexpected keys {unexpected[:3]}")
        if self.version < 0 and missing:
            raise KeyError(f"weights push: the first push lacks {missing[:3]}")
        self.version = version
        return version

    def get_version(self) -> int:
        return self.version

    def rollout(self, prompts: list[list[int]], answers: list[str], meta: dict | None = None) -> Rollout:
        """G completions per prompt with the weights of `self.version`, scored."""
        s = self.settings
        ro = generate_and_score(
            self.model, self.tokenizer, prompts, answers, group_size=s["group_size"],
            max_new_tokens=s["max_new_tokens"], temperature=s["temperature"], stop_tokens=s["stop_tokens"],
            generator=self.generator, reward_nodes=self.reward_nodes, reward_weights=self.reward_weights,
            top_k=s.get("top_k"), top_p=s.get("top_p"), version=self.version,
        )  # fmt: skip
        ro.meta = dict(meta or {})
        return ro

    def pid(self) -> int:
        import os

        return os.getpid()


def remote_generator_class(num_cpus: float = 1.0):
    """`RolloutGenerator` as a Ray actor class, restarted without limit when its process dies."""
    import ray

    return ray.remote(num_cpus=num_cpus, max_restarts=-1, max_task_retries=0)(RolloutGenerator)
