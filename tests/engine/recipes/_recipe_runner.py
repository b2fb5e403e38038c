"""Run a recipe in this process, as `python -m engine.recipes.<name>` does, for the recipe tests."""

from __future__ import annotations

import signal


def train_in_process(recipe_cls, check_config, cfg: dict, *, train: bool = True):
    """Check `cfg`, set up, train (unless `train=False`) and clean up `recipe_cls(cfg)`; the SIGTERM
    handler the recipe installs is put back afterwards. Returns the recipe (its `history`, `model`, ...)."""
    check_config(cfg)
    previous = signal.getsignal(signal.SIGTERM)
    recipe = recipe_cls(cfg)
    try:
        recipe.setup()
        if train:
            recipe.train()
    finally:
        recipe.cleanup()
        signal.signal(signal.SIGTERM, previous)
    return recipe
