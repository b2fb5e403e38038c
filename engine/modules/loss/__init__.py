"""Losses: plain and linear (fused-projection) cross-entropy; preference (DPO, ORPO, SimPO, KTO), KD,
GRPO and PPO losses."""

from engine.modules.loss.cross_entropy import ChunkedCrossEntropyLoss
from engine.modules.loss.dpo import DPOLoss
from engine.modules.loss.grpo import GRPOLoss, group_advantages
from engine.modules.loss.kd import KDLoss
from engine.modules.loss.kto import KTOLoss
from engine.modules.loss.linear_cross_entropy import LinearCrossEntropyLoss
from engine.modules.loss.orpo import ORPOLoss
from engine.modules.loss.ppo import PPOLoss
from engine.modules.loss.reward import BradleyTerryLoss
from engine.modules.loss.simpo import SimPOLoss

__all__ = [
    "BradleyTerryLoss",
    "ChunkedCrossEntropyLoss",
    "DPOLoss",
    "GRPOLoss",
    "KDLoss",
    "KTOLoss",
    "LinearCrossEntropyLoss",
    "ORPOLoss",
    "PPOLoss",
    "SimPOLoss",
    "group_advantages",
]
