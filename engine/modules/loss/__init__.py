"""Losses: plain and linear (fused-projection) cross-entropy; DPO, KD and GRPO losses join this list."""

from engine.modules.loss.cross_entropy import ChunkedCrossEntropyLoss
from engine.modules.loss.dpo import DPOLoss
from engine.modules.loss.grpo import GRPOLoss, group_advantages
from engine.modules.loss.kd import KDLoss
from engine.modules.loss.linear_cross_entropy import LinearCrossEntropyLoss

__all__ = [
    "ChunkedCrossEntropyLoss",
    "DPOLoss",
    "GRPOLoss",
    "KDLoss",
    "LinearCrossEntropyLoss",
    "group_advantages",
]
