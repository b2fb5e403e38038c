"""The replay buffer between generator actors and the GRPO trainer, with a staleness bound."""

from __future__ import annotations

from collections import deque

from engine.config import ConfigError


class ReplayBuffer:
    """FIFO of rollouts tagged with the policy version (trainer step) that generated them.

    A rollout made by version `v` may train step `t` (the trainer's version then) only when
    `t - v <= max_staleness`; older ones are dropped on `pop`, counted in `dropped`, and handed back by `drain_dropped()`.
    `max_staleness=0` accepts only rollouts of the current weights (synchronous GRPO).

    Args:
        max_staleness (int): the bound, >= 0. capacity (int): most rollouts held (oldest dropped).
    Raises:
        ConfigError: a negative bound or a capacity below 1.
    """

    def __init__(self, max_staleness: int = 1, capacity: int = 64) -> None:
        if max_staleness < 0:
            raise ConfigError(f"must be >= 0, got {max_staleness}", field="max_staleness")
        if capacity < 1:
            raise ConfigError(f"must be >= 1, got {capacity}", field="buffer_capacity")
        self.max_staleness = max_staleness
        self.capacity = capacity
        self._items: deque = deque()
        self.dropped = 0
        self._dropped_items: list = []

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rollout) -> None:
        """Append (a full buffer drops its oldest rollout, counted in `dropped`)."""
        if len(self._items) >= self.capacity:
            self._dropped_items.append(self._items.popleft())
            self.dropped += 1
        self._items.append(rollout)

    def pop(self, version: int):
        """The oldest rollout usable at trainer version `version`, or None; stale ones are dropped."""
        while self._items:
            item = self._items.popleft()
            if version - item.version <= self.max_staleness:
                return item
            self._dropped_items.append(item)
            self.dropped += 1
        return None

    def drain_dropped(self) -> list:
        """The rollouts dropped since the last call (the recipe re-queues their prompts)."""
        out, self._dropped_items = self._dropped_items, []
        return out
