"""Losses: plain and linear (fused-projection) cross-entropy; preference (DPO, ORPO, SimPO, KTO), KD,
GRPO and PPO losses."""

from engine.modules.loss.cross_entropy import ChunkedCrossEntropyLoss
from engine.modules.loss.dpo_loss import DPOLoss
from engine.modules.loss.grpo_loss import GRPOLoss, group_advantages
from engine.modules.loss.kd_loss import KDLoss
from engine.modules.loss.kto_loss import KTOLoss
from engine.modules.loss.linear_cross_entropy import LinearCrossEntropyLoss
from engine.modules.loss.orpo_loss import ORPOLoss
from engine.modules.loss.ppo_loss import PPOLoss
from engine.modules.loss.reward_loss import BradleyTerryLoss
from engine.modules.loss.simpo_loss import SimPOLoss

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
