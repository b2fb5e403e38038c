"""Setting up the models and tokenizer a recipe trains with, one function each: where the starting
weights are (`resolve_model_dir`), building, loading, freezing and sharding a model (`build_model`: the
trained policy or student, and frozen ones such as a reference or teacher), the reference policy of a
LoRA run (`reference_context`), the tokenizer (`build_tokenizer`) and the checks between them."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.config import ConfigError, instantiate


def resolve_model_dir(path: str | Path, *, field: str = "checkpoint_dir") -> Path:
    """A HF-format model folder; the word `demo` means the embedded SmolLM2-135M-Instruct.

    Raises:
        ConfigError: the folder does not exist or has no config.json (naming `field`).
    """
    if str(path) == "demo":
        from engine.models.demo_model import demo_model_dir

        return Path(demo_model_dir())
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file() and (folder / "adapter_config.json").is_file():
        raise ConfigError(
            f"{folder} holds LoRA adapters (adapter_config.json), not a full model",
            hint=f"point {field} at "
            "the base model folder (the adapters' base_model_name_or_path), or use `tunebench resume` to continue "
            "training those adapters",
            field=field,
        )
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"{folder} is not a model folder (no config.json)",
            hint="point it at a Hugging Face model folder (tunebench download REPO_ID) or use 'demo'",
            field=field,
        )
    return folder


def check_vocab(model: nn.Module, tokenizer: Any, *, field: str = "model") -> None:
    """Refuse a tokenizer whose token ids do not all fit the model's embedding table (`tok_embeddings`).

    Without this, the first batch dies in `torch.embedding` with "index out of range".
    Raises:
        ConfigError: naming `<field>.vocab_size`, the two sizes, and what to change.
    """
    rows = getattr(getattr(model, "tok_embeddings", None), "num_embeddings", None)
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(rows, int) and isinstance(size, int) and size > rows:
        raise ConfigError(
            f"the model has {rows} token embeddings but the tokenizer has {size} tokens",
            hint=f"use the model's own tokenizer, or set {field}.vocab_size to at least {size}",
            field=f"{field}.vocab_size",
        )


def check_sequence_length(
    model: nn.Module, dataset: Any, *, field: str = "dataset", model_field: str = "model"
) -> None:
    """Refuse samples longer than the model's `max_seq_len` (its RoPE table), before the first step.

    Without this, the first long batch dies in the rotary embedding with "index out of bounds".
    Datasets without `lengths()` (or models without `max_seq_len`) are not checked.
    Raises:
        ConfigError: naming `<field>.max_seq_len`, the longest sample, the limit of `model_field`
            (the config key of that model), what to set.
    """
    limit = getattr(model, "max_seq_len", None)
    lengths = getattr(dataset, "lengths", None)  # a property on some datasets, a method on others
    lengths = lengths() if callable(lengths) else lengths
    if not isinstance(limit, int) or lengths is None or len(lengths) == 0:
        return
    longest = int(max(lengths))
    if longest > limit:
        raise ConfigError(
            f"samples are up to {longest} tokens but {model_field}.max_seq_len is {limit}",
            hint=f"set the dataset's max_seq_len to {limit} or less (or raise {model_field}.max_seq_len)",
            field=f"{field}.max_seq_len",
        )


def _initialised(node: dict, model_dir: Path | None, *, dtype: torch.dtype, seed: int) -> nn.Module:
    """The full model on CPU: weights from `model_dir` (adapters seeded), or a seeded random init."""
    torch.manual_seed(seed)
    if model_dir is None:
        return instantiate(node).to(dtype=dtype)
    from engine.checkpoint import load_hf_weights

    with torch.device("meta"):
        model = instantiate(node)
    return load_hf_weights(model, model_dir, dtype=dtype)


def build_model(
    node: dict,
    checkpoint_dir: str | None,
    *,
    dtype: torch.dtype,
    seed: int,
    device: torch.device,
    trainable: bool,
    dist_info=None,
    mesh=None,
    activation_checkpointing: bool | int = False,
    compile: bool = False,
    fsdp_cfg: Mapping[str, bool] | None = None,
    expert_mesh=None,
    replicate_quantized: bool = False,
    field: str = "model",
    dir_field: str = "checkpoint_dir",
) -> tuple[nn.Module, bool, Path | None]:
    """Build, load and place one model: `(model, is_lora, model_dir)`.

    `trainable=True`: a `lora_*` builder trains adapters only, a plain one every weight.
    `trainable=False`: every parameter frozen and the model in eval mode (reference, teacher).
    One process: built and loaded directly. Several: every rank builds it on `meta` (no memory),
    `parallelize` shards it per block with FSDP2 over `mesh` (default: the data-parallel mesh of
    `dist_info`), and the sharded parameters are filled from the full weights that rank 0 alone
    builds (`materialize_model` broadcasts them). `activation_checkpointing`: True for every block,
    k > 1 for every k-th (trainable models only). `expert_mesh`: MoE experts sharded over it (EP).
    An NF4 (QLoRA) base on several ranks: every rank builds and quantises the whole model itself (same
    seed, same weights; NF4 cannot be broadcast or built on `meta`), then FSDP2 shards the NF4 bases
    that split evenly (torchao's NF4Tensor all-gathers its packed form) and keeps the others whole;
    `replicate_quantized`: pure tensor parallelism, nothing sharded by FSDP2.
    `field` / `dir_field`: the config keys of the model node and of its folder, named in errors.
    Raises ConfigError for a missing model folder or a trainable model with nothing to train.
    """
    from engine.modules.peft.utils import get_adapter_params, set_trainable_params
    from engine.training import build_world_mesh, materialize_model, parallelize
    from engine.training.distributed import rank_world

    rank, world = rank_world()
    model_dir = resolve_model_dir(checkpoint_dir, field=dir_field) if checkpoint_dir is not None else None
    replicated = False  # every rank holds the whole model (an NF4 base under pure TP): no FSDP2
    built_whole = False  # every rank built the full model itself (an NF4 base): nothing to materialise
    if world > 1:
        with torch.device("meta"):
            model = instantiate(node)
        if any(getattr(m, "quantize_base", False) for m in model.modules()):
            built_whole, replicated = True, replicate_quantized
            model = _initialised(node, model_dir, dtype=dtype, seed=seed).to(device=device)
    else:
        model = _initialised(node, model_dir, dtype=dtype, seed=seed)
    adapters = get_adapter_params(model)
    is_lora = bool(adapters) and trainable
    if not trainable:
        for p in model.parameters():
            p.requires_grad_(False)
    elif is_lora:
        set_trainable_params(model, adapters.keys())
    if world > 1 and mesh is None:
        mesh = build_world_mesh(dist_info)
    model = parallelize(
        model,
        mesh=mesh if world > 1 else None,
        activation_checkpointing=activation_checkpointing if trainable else False,
        compile=compile,
        fsdp=world > 1 and not replicated,
        expert_mesh=expert_mesh,
        **dict(fsdp_cfg or {}),  # the schema's `fsdp` block: reshard_after_forward, cpu_offload
    )
    if world > 1 and not built_whole:
        full = _initialised(node, model_dir, dtype=dtype, seed=seed).state_dict() if rank == 0 else {}
        materialize_model(model, device=device, state_dict=full, broadcast_from_rank0=True)
        del full
    elif world == 1:
        model.to(device=device)
    if trainable and not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            "nothing to train (no parameter requires grad)", hint="check the component", field=field
        )
    if not trainable:
        model.eval()
    return model, is_lora, model_dir


def reference_context(model: nn.Module, reference: nn.Module | None):
    """`(module, context)` computing the reference policy: the frozen copy, or — for LoRA, where
    `reference` is None — the policy itself with its adapters disabled (no second copy)."""
    if reference is not None:
        return reference, contextlib.nullcontext()
    from engine.modules.peft.utils import disable_adapters

    return model, disable_adapters(model)


def build_tokenizer(node: dict) -> Any:
    """The `tokenizer` component; `path: demo` means the embedded model's tokenizer."""
    if isinstance(node, dict) and str(node.get("path")) == "demo":
        return instantiate(node, path=str(resolve_model_dir("demo")))
    return instantiate(node)
