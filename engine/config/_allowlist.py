"""What a `_component_` may name without the user widening anything: an allow-list, not a deny-list.

Two kinds of entries:
- `NAMED`: exact dotted names, each a callable some shipped config, recipe, test or workbench control
  needs (optimizers, LR schedulers, torchao's low-bit optimizers, a few `torch.nn` building blocks, the
  project's LR schedules and low-bit optimizer builders). Nothing under them: `torch.optim.AdamW` does
  not allow `torch.optim.AdamW.register_step_pre_hook`, and `torch.` allows nothing.
- `ENGINE_MODULES`: the project's own component modules (model builders, layers and losses, dataset
  builders, tokenizers, templates, reward functions), every public name defined in them. Each was read for
  what it can do: none runs a command, loads a pickle or writes a path a config names (reading files the
  config names is what datasets, tokenizers and model folders are for). `ENGINE_EXCLUDED` lists the
  modules under them that do write or import by name (the dataset cache's `clear`, torchao's importer). The rest of `engine` is out of reach on
  purpose: `engine.config` (a config must not widen its own allow-list), `engine.checkpoint` (writes and
  loads checkpoints), `engine.tracking` (writes the tracker), `engine.recipes`, `engine.training` (but the
  names below), `engine.eval`, the RL trainer and its Ray actors.
`tests/engine/config/test_allowlist.py` checks that every `_component_` of every shipped config resolves
under this list, and that the engine modules on it do not start processes or write files.
"""

from __future__ import annotations

_OPTIMIZERS = ("ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "RAdam",
               "RMSprop", "Rprop", "SGD")  # fmt: skip
_SCHEDULERS = ("ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR", "ExponentialLR",
               "LinearLR", "MultiStepLR", "OneCycleLR", "PolynomialLR", "StepLR")  # fmt: skip
_NN = ("Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "Identity", "Sequential", "ModuleList",
       "ModuleDict", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "CrossEntropyLoss", "MSELoss")  # fmt: skip
_TORCHAO = ("AdamW8bit", "AdamW4bit", "AdamWFp8", "Adam8bit", "Adam4bit", "AdamFp8")

NAMED: frozenset[str] = frozenset(
    [f"torch.optim.{n}" for n in _OPTIMIZERS]
    + [f"torch.optim.lr_scheduler.{n}" for n in _SCHEDULERS]
    + [f"torch.nn.{n}" for n in _NN]
    + [f"torchao.optim.{n}" for n in _TORCHAO]
    + [
        "engine.training.cosine_schedule_with_warmup",
        "engine.training.constant_schedule_with_warmup",
        "engine.training.linear_schedule_with_warmup",
        "engine.training.low_bit_optimizers.adamw_8bit",
        "engine.training.low_bit_optimizers.adamw_4bit",
    ]
)

ENGINE_MODULES: tuple[str, ...] = (
    "engine.models",
    "engine.modules",
    "engine.data",
    "engine.rl.rewards",
    "engine.rl.toy_task",
    "engine.rl.toy_preferences",
    "engine.training.lr_schedules",
)

ENGINE_EXCLUDED: tuple[str, ...] = ("engine.data.cache", "engine.modules.torchao_import")


def under(name: str, prefix: str) -> bool:
    """`name` is `prefix` or lies under it at a dot boundary (`collections` does not cover `collectionsx`)."""
    return name == prefix or name.startswith(prefix + ".")


def in_engine_modules(name: str) -> bool:
    """`name` lies in one of `ENGINE_MODULES` and none of `ENGINE_EXCLUDED`."""
    return any(under(name, m) for m in ENGINE_MODULES) and not any(under(name, m) for m in ENGINE_EXCLUDED)


def listed(name: str) -> bool:
    """`name` is allowed without any user widening: in `NAMED` or in the engine's component modules."""
    return name in NAMED or in_engine_modules(name)
