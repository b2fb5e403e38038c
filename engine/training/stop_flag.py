"""The SIGTERM flag (`tunebench stop`): the handler only sets it; the loop asks every rank at each step."""

from __future__ import annotations

import signal

import torch


class StopFlag:
    """Set by SIGTERM (from `tunebench stop`) and checked by the loop at each optimizer step."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> StopFlag:
        def _handler(signum, frame):  # noqa: ARG001 - signal handler signature
            self.requested = True

        signal.signal(signal.SIGTERM, _handler)
        return self

    def requested_anywhere(self, device: torch.device) -> bool:
        """True when any rank got SIGTERM (a collective: every rank calls it at the same step)."""
        from engine.training.distributed import all_reduce_sum

        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        return bool(all_reduce_sum(flag).item() > 0)
