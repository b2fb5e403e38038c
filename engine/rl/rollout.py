"""One GRPO rollout: sample G completions per prompt and score them. Shared by the synchronous
recipe (in-process) and the Ray generator actors, so both produce the same rollouts from the same
weights, prompts and random generator."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.config import ConfigError, instantiate


@dataclass
class Rollout:
    """The completions of one batch of prompts (R = prompts x G rows), their rewards and provenance."""

    prompts: list[list[int]]  # R prompt id lists (each prompt repeated G times, groups contiguous)
    completions: list[list[int]]  # R completion id lists (stop token included when reached)
    texts: list[str]
    prompt_texts: list[str]
    answers: list[str]
    rewards: torch.Tensor  # [R] fp32 weighted total
    per_reward: dict[str, torch.Tensor]  # name -> [R]
    gen_time: float  # seconds spent generating
    version: int = 0  # policy version (trainer step) whose weights generated it
    meta: dict = field(default_factory=dict)


def score(reward_nodes: dict, weights: dict, completions: list[str], answers: list[str], prompts: list[str]):
    """`(total [R] fp32, {name: [R]})`: every reward component called through `instantiate`
    (allow-listed) with `completions=`, `answers=`, `prompts=`. Raises ConfigError for a reward that
    does not return one value per completion."""
    per = {}
    for name, node in reward_nodes.items():
        values = instantiate(node, completions=completions, answers=answers, prompts=prompts)
        if len(values) != len(completions):
            raise ConfigError(
                f"returned {len(values)} values for {len(completions)} completions",
                hint="return one each",
                field=f"rewards.{name}",
            )
        per[name] = torch.tensor([float(v) for v in values], dtype=torch.float32)
    total = sum(float(weights.get(n, 1.0)) * v for n, v in per.items())
    return total, per


def generate_and_score(
    model,
    tokenizer,
    prompts: list[list[int]],
    answers: list[str],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    stop_tokens: list[int],
    generator: torch.Generator,
    reward_nodes: dict,
    reward_weights: dict,
    top_k: int | None = None,
    top_p: float | None = None,
    version: int = 0,
) -> Rollout:
    """Repeat each prompt `group_size` times, sample with engine.generation, decode, score."""
    from engine.generation import generate

    rep_prompts = [list(p) for p in prompts for _ in range(group_size)]
    rep_answers = [a for a in answers for _ in range(group_size)]
    t0 = time.perf_counter()
    out = generate(
        model, rep_prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        stop_tokens=stop_tokens, pad_id=tokenizer.pad_id, generator=generator,
    )  # fmt: skip
    gen_time = time.perf_counter() - t0
    completions = [list(map(int, c)) for c in out.completions]
    texts = [tokenizer.decode(c) for c in completions]
    prompt_texts = [tokenizer.decode(p) for p in rep_prompts]
    total, per = score(reward_nodes, reward_weights, texts, rep_answers, prompt_texts)
    return Rollout(rep_prompts, completions, texts, prompt_texts, rep_answers, total, per, gen_time, version)


def rollout_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int):
    """Right-padded `tokens [R,L]`, shifted `labels [R,L]` (-100 outside completions), `mask [R,L]`.

    Row r is `prompt + completion`; `labels[r, i] = tokens[r, i+1]` exactly where token i+1 is a
    completion token, so the log-prob at i scores that completion token.
    """
    L = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    R = len(prompts)
    tokens = torch.full((R, L), pad_id, dtype=torch.long)
    labels = torch.full((R, L), -100, dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        row = list(p) + list(c)
        tokens[r, : len(row)] = torch.tensor(row)
        if c:
            labels[r, len(p) - 1 : len(row) - 1] = torch.tensor(list(c))
    return tokens, labels, labels != -100


def rollout_attention_mask(
    prompts: list[list[int]], completions: list[list[int]], length: int
) -> torch.Tensor:
    """`[R, length]` bool, True on row r's prompt and completion tokens and False on the right padding
    `rollout_batch` adds (transformers' `attention_mask` of those rows; a sampled token equal to the pad
    id is still a token)."""
    lengths = torch.tensor([len(p) + len(c) for p, c in zip(prompts, completions, strict=True)])
    return torch.arange(length)[None, :] < lengths[:, None]


def prompt_loader(dataset_node: dict | list, tokenizer, *, batch_size: int, seed: int, recipe: str):
    """The rollout recipes' data: the config's prompt dataset, `batch_size` prompts a step in a seeded
    shuffled order that resume can skip into (`EpochBatchSampler`, as `loader.batch_sampler`),
    collated by `prompt_collate` (prompts + answers).

    Raises:
        ConfigError: naming `dataset` when its samples are not prompts (`recipe` names who needs them).
    """
    from torch.utils.data import DataLoader

    from engine.data import build_dataset
    from engine.data.prompts import prompt_collate
    from engine.data.sampler import EpochBatchSampler

    dataset = build_dataset(dataset_node, tokenizer)
    if len(dataset) and "prompt_tokens" not in dataset[0]:
        raise ConfigError(
            f"{recipe} needs prompts with answers",
            hint="use prompt_dataset or demo_prompt_dataset",
            field="dataset",
        )
    sampler = EpochBatchSampler(len(dataset), batch_size=batch_size, seed=seed, shuffle=True)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=prompt_collate)
