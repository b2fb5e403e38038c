"""Activation offloading: tensors saved for backward go to pinned CPU memory, and come back when used.

CUDA only: on CPU there is nowhere cheaper to put them. Trade-off: frees most activation memory at
the cost of host<->device copies (pinned and non-blocking, so they overlap with compute partly);
combine with activation checkpointing to offload only the block inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ConfigError


class ActivationOffloading(torch.autograd.graph.saved_tensors_hooks):
    """Context manager: `with ActivationOffloading(model): loss = ...` (backward may run outside it).

    Args:
        model: its parameters (and views of them) are never offloaded — they stay on the device anyway.
        min_offload_bytes: smaller tensors stay where they are (copies would cost more than they free);
            default 1 MiB.

    Raises:
        ConfigError: CUDA is not available.
    """

    def __init__(self, model: nn.Module, min_offload_bytes: int = 1 << 20):
        if not torch.cuda.is_available():
            raise ConfigError(
                "needs a CUDA device (activations are moved to CPU memory)",
                hint="set enable_activation_offloading=false on CPU; activation_checkpointing saves memory there",
                field="enable_activation_offloading",
            )
        self.param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.min_offload_bytes = int(min_offload_bytes)
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor):
        if (
            tensor.device.type != "cuda"
            or type(tensor) is not torch.Tensor  # subclasses (DTensor, NF4) stay as they are
            or tensor.numel() * tensor.element_size() < self.min_offload_bytes
            or tensor.untyped_storage().data_ptr() in self.param_storages
        ):
            return tensor
        host = torch.empty(tensor.shape, dtype=tensor.dtype, layout=tensor.layout, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        return (tensor.device, host)

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=True)
