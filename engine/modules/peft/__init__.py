"""Parameter-efficient fine-tuning modules: LoRA, DoRA and QLoRA (NF4 base) linears."""

from engine.modules.peft.lora import LoRALinear, dequantize, is_nf4, lora_scale, to_nf4
from engine.modules.peft.utils import (
    disable_adapters,
    get_adapter_params,
    merged_state_dict,
    set_trainable_params,
)

__all__ = [
    "LoRALinear",
    "dequantize",
    "disable_adapters",
    "get_adapter_params",
    "is_nf4",
    "lora_scale",
    "merged_state_dict",
    "set_trainable_params",
    "to_nf4",
]
