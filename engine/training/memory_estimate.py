"""Estimate the accelerator memory a fine-tuning run needs before launching it.

Pure arithmetic (no torch import) from a model's shape and the run's options, so the workbench and
the CLI can show it instantly. The estimate has four parts, each in bytes per rank:

- weights:     every parameter at its storage width; QLoRA stores the base linears in NF4
               (4 bits + one bf16 scale per 64-value block = 4.25 bits), LoRA adapters at full width.
- gradients:   one gradient per *trainable* parameter; optimizer-in-backward frees each gradient as
               soon as its parameter is stepped, so only the largest one is alive at a time.
- optimizer:   AdamW keeps two states per trainable parameter (fp32, or 1 / 0.5 bytes with the 8-bit /
               4-bit optimizers from torchao); SGD keeps none (momentum is off by default).
- activations: the tensors autograd saves for backward in every decoder layer, plus the logits and
               their fp32 upcast for cross-entropy. Activation checkpointing keeps only each
               checkpointed layer's input (every `ac_every_k`-th layer) and recomputes one layer at a
               time; linear cross-entropy never builds the full `[B, S, V]` logits, only one chunk.

Mixtures of experts (`num_experts` > 0; `intermediate_dim` is one expert's hidden size): every layer
holds `num_experts` SwiGLU experts and a `D x E` router; a token's MLP activations are saved for each
of its `experts_per_token` experts (plus its routed copy and weighted output), router logits and
probabilities in fp32. Expert parallelism (`ep`) gives each rank `E / ep` experts, left out of FSDP2
(as `engine.training.expert_parallel` does); the other weights are FSDP-sharded as usual. LoRA on the
MLP means adapters on every expert; QLoRA stores the attention in NF4 and the experts at full width.

Packing and compile are speed options: a packed batch has the same `batch x seq_len` tokens, and the
estimate does not model compiled kernels' savings; both only add a note saying so.

Mesh-aware (`nproc` ranks = data_parallel_replicate x data_parallel_shard x context_parallel x
tensor_parallel, the DeviceMesh's order): tensor parallelism splits every linear weight and the
vocabulary-sharded embedding/output over `tp` ranks; FSDP2 then shards what a rank holds over the
data-shard and context-parallel ranks together (context-parallel ranks hold the same weights, so they
join the shard group, as torchtitan does); replicas (`dp_replicate`, HSDP across nodes) hold a full copy
of the shard each, saving nothing. Activations: the batch is per data-parallel rank; context
parallelism splits the sequence over `cp` ranks; tensor parallelism with sequence parallelism and loss
parallelism splits every saved tensor over `tp` ranks (norm and residual tensors on the sequence, the
attention and MLP ones on heads/features, the logits on the vocabulary).
The figure ignores the CUDA context and allocator fragmentation (~0.5-1 GiB on a real GPU), which
`MemoryEstimate.total_bytes` adds as `overhead_bytes`.

Length: over 500 lines because each recipe's estimate (SFT, DPO, KD, GRPO, PPO, reward model, MoE,
mesh) is hand-checkable arithmetic kept next to the shared parts it sums; tests check each by bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GiB = 1024**3

# Storage width of one value, by dtype name.
DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0}
# NF4: 4 bits per value plus one bf16 absmax per block of 64 values (torchao's default block size).
NF4_BYTES = 0.5 + 2.0 / 64
# Optimizer state bytes per trainable parameter.
OPTIMIZER_STATE_BYTES = {
    "adamw": None,  # two states at the parameter width (resolved below)
    "adamw8bit": 2 * 1.0 + 2 * 4.0 / 256,  # two int8 states + an fp32 scale per 256-value block each
    "adamw4bit": 2 * 0.5 + 2 * 4.0 / 128,  # two 4-bit states + an fp32 scale per 128-value block each
    "sgd": 0.0,
}
METHODS = ("full", "lora", "qlora")
CUDA_OVERHEAD_BYTES = int(0.75 * GiB)


class MemoryEstimateError(ValueError):
    """A bad option for the estimate; the message names the option and what to change."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder that memory depends on.

    `kv_dim` (keys and values: `head_dim * num_kv_heads`) defaults to `dim` (no grouped-query
    attention), `q_dim` (`head_dim * num_heads`) to `dim`, `intermediate_dim` to `4 * dim`.
    """

    num_layers: int
    dim: int
    vocab_size: int
    intermediate_dim: int = 0
    kv_dim: int = 0
    tied_embeddings: bool = True
    q_dim: int = 0
    num_experts: int = 0  # mixture of experts: experts per layer (0: dense)
    experts_per_token: int = 0

    def __post_init__(self) -> None:
        for name in ("num_layers", "dim", "vocab_size"):
            if int(getattr(self, name)) <= 0:
                raise MemoryEstimateError(f"model shape: {name} must be a positive integer")
        if not self.intermediate_dim:
            object.__setattr__(self, "intermediate_dim", 4 * self.dim)
        if not self.kv_dim:
            object.__setattr__(self, "kv_dim", self.dim)
        if not self.q_dim:
            object.__setattr__(self, "q_dim", self.dim)

    @property
    def embedding_params(self) -> int:
        """Token embedding plus (when untied) the output projection: `V * D` each."""
        return self.vocab_size * self.dim * (1 if self.tied_embeddings else 2)

    @property
    def attention_params_per_layer(self) -> int:
        d, q, kv = self.dim, self.q_dim, self.kv_dim
        return d * q + 2 * d * kv + q * d

    @property
    def expert_params_per_layer(self) -> int:
        """All experts of one MoE layer (0 when dense)."""
        return self.num_experts * 3 * self.dim * self.intermediate_dim

    @property
    def linear_params_per_layer(self) -> int:
        """q, k, v, o projections plus the SwiGLU MLP (gate, up, down), or the experts and router."""
        if self.num_experts:
            return (
                self.attention_params_per_layer + self.expert_params_per_layer + self.num_experts * self.dim
            )
        return self.attention_params_per_layer + 3 * self.dim * self.intermediate_dim

    @property
    def norm_params(self) -> int:
        """Two RMSNorm weights per layer and the final norm."""
        return (2 * self.num_layers + 1) * self.dim

    @property
    def num_params(self) -> int:
        return self.embedding_params + self.num_layers * self.linear_params_per_layer + self.norm_params

    @classmethod
    def from_card(cls, card: Any) -> ModelShape:
        """Read a model card (object or mapping) with the usual field names.

        Accepts `num_layers`/`layers`/`num_hidden_layers`, `dim`/`embed_dim`/`hidden_size`, `vocab_size`,
        `intermediate_dim`/`hidden_dim`/`intermediate_size`, `kv_dim` or `num_kv_heads` + `num_heads`
        (+ `head_dim`), `tied_embeddings`/`tie_word_embeddings`. Raises `MemoryEstimateError` when a
        size is missing.
        """

        def get(*names: str, default: Any = None) -> Any:
            for name in names:
                value = card.get(name) if isinstance(card, dict) else getattr(card, name, None)
                if value is not None:
                    return value
            return default

        dim = get("dim", "embed_dim", "hidden_size")
        num_layers = get("num_layers", "layers", "n_layers", "num_hidden_layers")
        vocab = get("vocab_size")
        if not (dim and num_layers and vocab):
            raise MemoryEstimateError(
                "model card: needs num_layers, dim (or embed_dim/hidden_size) and vocab_size to estimate memory"
            )
        kv_dim, q_dim = get("kv_dim", default=0), 0
        heads, kv_heads = get("num_heads", "num_attention_heads"), get("num_kv_heads", "num_key_value_heads")
        if heads and kv_heads:
            head_dim = int(get("head_dim", default=0) or int(dim) // int(heads))
            kv_dim = kv_dim or head_dim * int(kv_heads)
            q_dim = head_dim * int(heads)
        return cls(
            num_layers=int(num_layers),
            dim=int(dim),
            vocab_size=int(vocab),
            # a Qwen3-MoE config.json: `intermediate_size` is its (unused) dense size
            intermediate_dim=int(
                get("moe_intermediate_size", "intermediate_dim", "hidden_dim", "intermediate_size", default=0)
            ),
            kv_dim=int(kv_dim or 0),
            tied_embeddings=bool(get("tied_embeddings", "tie_word_embeddings", default=True)),
            q_dim=q_dim,
            num_experts=int(get("num_experts", "num_local_experts", default=0) or 0),
            experts_per_token=int(get("experts_per_token", "num_experts_per_tok", default=0) or 0),
        )


@dataclass(frozen=True)
class TrainingOptions:
    """The run options memory depends on. Defaults: LoRA-free full fine-tune in bf16, batch 1 x 2048."""

    method: str = "full"  # full | lora | qlora
    dtype: str = "bf16"
    batch_size: int = 1
    seq_len: int = 2048
    optimizer: str = "adamw"  # adamw | adamw8bit | adamw4bit | sgd
    lora_rank: int = 8
    lora_attn_modules: tuple[str, ...] = ("q_proj", "v_proj")
    lora_mlp: bool = False
    activation_checkpointing: bool = False
    ac_every_k: int = 1  # checkpoint every k-th layer only (with activation_checkpointing)
    optimizer_in_backward: bool = False
    linear_cross_entropy: bool = False
    ce_chunk_tokens: int = 1024
    compile: bool = False  # speed option; memory unchanged in this estimate
    packed: bool = False  # speed option; same tokens per batch, memory unchanged
    nproc: int = 1  # world size: dp_replicate x dp_shard x cp x tp
    dp_replicate: int = 1  # HSDP replicas (across nodes): no memory saved
    cp: int = 1  # context-parallel ranks: the sequence split over them
    tp: int = 1  # tensor-parallel ranks (with sequence and loss parallelism)
    ep: int = 1  # expert-parallel ranks (MoE): each holds E / ep experts, outside FSDP2
    sequences_per_sample: int = 1  # DPO: a chosen and a rejected row per pair, both with activations
    # (label, bytes) of other whole models the run holds frozen (DPO's reference copy of a full
    # fine-tune, the KD teacher): weights only, sharded like the policy; they save no activations
    frozen_models: tuple[tuple[str, float], ...] = ()
    # GRPO: tokens (rows x length) whose keys and values the rollout generation caches before training;
    # generation and backward do not overlap, so the larger of the two counts as activations
    rollout_kv_tokens: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise MemoryEstimateError(f"method: {self.method!r} is unknown; use one of {', '.join(METHODS)}")
        if self.dtype not in DTYPE_BYTES:
            raise MemoryEstimateError(f"dtype: {self.dtype!r} is unknown; use bf16, fp16 or fp32")
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            raise MemoryEstimateError(
                f"optimizer: {self.optimizer!r} is unknown; use one of {', '.join(OPTIMIZER_STATE_BYTES)}"
            )
        if int(self.rollout_kv_tokens) < 0:
            raise MemoryEstimateError(f"rollout_kv_tokens: must be >= 0, got {self.rollout_kv_tokens}")
        for label, size in self.frozen_models:
            if float(size) < 0:
                raise MemoryEstimateError(f"frozen_models: {label!r} has a negative size ({size})")
        for name in (
            "batch_size", "seq_len", "nproc", "lora_rank", "ce_chunk_tokens", "ac_every_k", "sequences_per_sample",
            "dp_replicate", "cp", "tp", "ep",
        ):  # fmt: skip
            if int(getattr(self, name)) <= 0:
                raise MemoryEstimateError(f"{name}: must be a positive integer, got {getattr(self, name)}")
        other = self.dp_replicate * self.cp * self.tp
        if self.nproc % other:
            raise MemoryEstimateError(
                f"nproc {self.nproc}: data_parallel_replicate_dim x context_parallel_dim x tensor_parallel_dim "
                f"= {other} must divide it; change those degrees or the process count"
            )

    @property
    def dp_shard(self) -> int:
        """Data-parallel shard ranks: what the world size leaves after replicas, cp and tp."""
        return self.nproc // (self.dp_replicate * self.cp * self.tp)

    @property
    def fsdp_shards(self) -> int:
        """Ranks one FSDP2 group shards a tensor-parallel slice over (data shard x context parallel)."""
        return self.dp_shard * self.cp


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank, by part. `total_bytes` adds `overhead_bytes` (CUDA context, fragmentation)."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    trainable_params: int
    total_params: int
    overhead_bytes: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.overhead_bytes
        )

    def as_gib(self) -> dict[str, float]:
        """The parts and the total in GiB, for display."""
        return {
            "weights": self.weights_bytes / GiB,
            "gradients": self.gradients_bytes / GiB,
            "optimizer": self.optimizer_bytes / GiB,
            "activations": self.activations_bytes / GiB,
            "overhead": self.overhead_bytes / GiB,
            "total": self.total_bytes / GiB,
        }

    def fits(self, device_bytes: float | None) -> bool | None:
        """True when the total fits in `device_bytes`; None when the device size is unknown."""
        if not device_bytes:
            return None
        return self.total_bytes <= device_bytes


_LORA_SHAPES = {  # (in_features, out_features) of each adaptable projection, by model shape
    "q_proj": lambda s: (s.dim, s.q_dim),
    "k_proj": lambda s: (s.dim, s.kv_dim),
    "v_proj": lambda s: (s.dim, s.kv_dim),
    "qkv_proj": lambda s: (s.dim, s.q_dim + 2 * s.kv_dim),  # Phi-3: one adapter on the fused q, k, v
    "output_proj": lambda s: (s.q_dim, s.dim),
    "o_proj": lambda s: (s.q_dim, s.dim),
}


def lora_params(shape: ModelShape, opts: TrainingOptions) -> int:
    """Trainable LoRA parameters: `rank * (in + out)` for each adapted projection in every layer."""
    per_layer = 0
    for name in opts.lora_attn_modules:
        if name not in _LORA_SHAPES:
            raise MemoryEstimateError(
                f"lora_attn_modules: {name!r} is unknown; use some of q_proj, k_proj, v_proj, qkv_proj, output_proj"
            )
        fan_in, fan_out = _LORA_SHAPES[name](shape)
        per_layer += opts.lora_rank * (fan_in + fan_out)
    if opts.lora_mlp:  # MoE: one adapter per expert
        per_layer += max(1, shape.num_experts) * 3 * opts.lora_rank * (shape.dim + shape.intermediate_dim)
    return shape.num_layers * per_layer


def expert_lora_params(shape: ModelShape, opts: TrainingOptions) -> int:
    """The expert adapters among `lora_params` (sharded by expert parallelism like the experts)."""
    if not (shape.num_experts and opts.lora_mlp and opts.method != "full"):
        return 0
    return shape.num_layers * shape.num_experts * 3 * opts.lora_rank * (shape.dim + shape.intermediate_dim)


def activation_elements_per_token_per_layer(shape: ModelShape) -> int:
    """Values autograd saves per token in one decoder layer (SDPA with a fused kernel, no `S x S`).

    Norm inputs (2 D), q/k/v (D + 2 KV) and the attention output (D) plus the `o` projection input (D),
    the MLP's gate and up outputs (2 F), the SwiGLU product fed to `down` (F) and the SiLU input (F).
    """
    d, q, kv, f = shape.dim, shape.q_dim, shape.kv_dim, shape.intermediate_dim
    if shape.num_experts:
        # per routed (token, expert) pair: its copy of x, the 4 F of the expert, its weighted output;
        # per token: router logits and fp32 probabilities (counted as 4 values of the width)
        k = shape.experts_per_token
        return 2 * d + (q + 2 * kv) + 2 * q + k * (4 * f + 2 * d) + 4 * shape.num_experts
    return 2 * d + (q + 2 * kv) + 2 * q + 4 * f


def estimate_memory(shape: ModelShape, opts: TrainingOptions, *, overhead: bool = False) -> MemoryEstimate:
    """The per-rank memory of training `shape` with `opts`; `overhead=True` adds a CUDA context figure."""
    width = DTYPE_BYTES[opts.dtype]
    total = shape.num_params
    notes: list[str] = []

    # Weights (sharded by FSDP over nproc ranks).
    if opts.method == "qlora":
        base_linear = shape.num_layers * (
            shape.attention_params_per_layer if shape.num_experts else shape.linear_params_per_layer
        )
        weights = base_linear * NF4_BYTES + (total - base_linear) * width
    else:
        weights = total * width
    trainable = total if opts.method == "full" else lora_params(shape, opts)
    if opts.method != "full":
        weights += trainable * width
    if opts.ep > 1 and not shape.num_experts:
        raise MemoryEstimateError("ep: expert parallelism needs a mixture-of-experts model; set it to 1")
    # Expert parallelism: experts (and their adapters, gradients, states) split over ep ranks, the
    # rest sharded by FSDP2; computed apart below.
    experts = float(shape.num_layers * shape.expert_params_per_layer) if opts.ep > 1 else 0.0
    expert_trainable = (
        (experts if opts.method == "full" else expert_lora_params(shape, opts)) if experts else 0.0
    )
    expert_weights = experts * width + (expert_trainable * width if opts.method != "full" else 0.0)
    weights -= expert_weights

    # Gradients: all trainable ones, or only the largest parameter with optimizer-in-backward.
    if opts.optimizer_in_backward:
        largest = shape.vocab_size * shape.dim if opts.method == "full" else trainable / shape.num_layers
        gradients = largest * width
        notes.append("optimizer-in-backward: one gradient alive at a time")
    else:
        gradients = (trainable - expert_trainable) * width

    # Optimizer state.
    state = OPTIMIZER_STATE_BYTES[opts.optimizer]
    if state is None:  # torch AdamW: exp_avg and exp_avg_sq at the parameter's own width
        state = 2 * width
    optimizer = (trainable - expert_trainable) * state

    # Other frozen models: weights only.
    shard = float(opts.fsdp_shards * opts.tp)  # tp slices, each sharded by FSDP2; replicas save nothing
    for label, size in opts.frozen_models:
        weights += float(size)
        notes.append(f"{label}: {float(size) / shard / GiB:.2f} GiB of frozen weights")
    weights, gradients, optimizer = weights / shard, gradients / shard, optimizer / shard
    if experts:
        weights += expert_weights / opts.ep
        if not opts.optimizer_in_backward:
            gradients += expert_trainable * width / opts.ep
        optimizer += expert_trainable * state / opts.ep
        notes.append(
            f"expert parallel: {shape.num_experts // opts.ep} of {shape.num_experts} experts per rank"
        )

    # Activations (per rank; the batch is per data-parallel rank, the sequence split over cp ranks).
    tokens = opts.batch_size * -(-opts.seq_len // opts.cp) * opts.sequences_per_sample
    if opts.sequences_per_sample > 1:
        notes.append(
            f"{opts.sequences_per_sample} rows per sample (chosen and rejected): activations of each"
        )
    per_layer = activation_elements_per_token_per_layer(shape) * tokens * width
    if opts.activation_checkpointing:
        # Layers 0, k, 2k, ... keep only their input [B, S, D] and are recomputed one at a time in
        # backward (one layer's activations alive); the others keep everything.
        checkpointed = -(-shape.num_layers // opts.ac_every_k)
        plain = shape.num_layers - checkpointed
        activations = checkpointed * tokens * shape.dim * width + plain * per_layer + per_layer
        every = "every layer" if opts.ac_every_k == 1 else f"every {opts.ac_every_k}th layer"
        notes.append(f"activation checkpointing ({every}): recomputed in backward")
    else:
        activations = shape.num_layers * per_layer
    # Logits [B, S, V] in the compute dtype, their fp32 upcast for CE, and the gradient of that.
    logit_tokens = min(tokens, opts.ce_chunk_tokens) if opts.linear_cross_entropy else tokens
    activations += logit_tokens * shape.vocab_size * (width + 4 + 4)
    if opts.linear_cross_entropy:
        notes.append(f"linear cross-entropy: logits built {opts.ce_chunk_tokens} tokens at a time")
    if opts.rollout_kv_tokens:
        # [rows, L] tokens x layers x (keys + values) x kv_dim, in the compute dtype
        kv_cache = opts.rollout_kv_tokens * shape.num_layers * 2 * shape.kv_dim * width
        notes.append(f"rollouts: KV cache {kv_cache / GiB:.2f} GiB before each training pass (not at once)")
        activations = max(activations, kv_cache)
    activations /= opts.tp  # sequence + loss parallel: every saved tensor is split over tp ranks
    if opts.packed:
        notes.append("packing: speed option; memory unchanged")
    if opts.compile:
        notes.append("compile: speed option; memory unchanged")
    if opts.nproc > 1:
        notes.append(mesh_note(opts))

    return MemoryEstimate(
        weights_bytes=weights,
        gradients_bytes=gradients,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        trainable_params=int(trainable),
        total_params=int(total),
        overhead_bytes=float(CUDA_OVERHEAD_BYTES if overhead else 0),
        notes=notes,
    )


def mesh_note(opts: TrainingOptions) -> str:
    """One line naming the mesh and what each dimension does to memory."""
    parts = []
    if opts.dp_replicate > 1:
        parts.append(f"{opts.dp_replicate} replicas (HSDP)")
    parts.append(
        f"FSDP over {opts.fsdp_shards} ranks"
        + (f" ({opts.dp_shard} dp x {opts.cp} cp)" if opts.cp > 1 else "")
    )
    if opts.cp > 1:
        parts.append(f"sequence / {opts.cp} (context parallel)")
    if opts.tp > 1:
        parts.append(f"weights and activations / {opts.tp} (tensor parallel)")
    return (
        "mesh "
        + " x ".join(str(d) for d in (opts.dp_replicate, opts.dp_shard, opts.cp, opts.tp))
        + " (replicate, shard, cp, tp): "
        + ", ".join(parts)
    )


def frozen_model_bytes(shape: ModelShape, dtype: str) -> float:
    """Bytes of a whole model of `shape` held frozen in `dtype` (a reference copy, a teacher)."""
    if dtype not in DTYPE_BYTES:
        raise MemoryEstimateError(f"dtype: {dtype!r} is unknown; use bf16, fp16 or fp32")
    return float(shape.num_params) * DTYPE_BYTES[dtype]


def trained_side_model_bytes(
    shape: ModelShape, dtype: str, optimizer: str = "adamw", *, full: bool = True
) -> float:
    """Bytes of a second model trained next to the policy (PPO's value model), not counting its
    activations: weights, and for a full fine-tune a gradient and the optimizer's state per weight
    (a LoRA one's adapters are small next to the base, which is counted as weights only)."""
    weights = frozen_model_bytes(shape, dtype)
    if not full:
        return weights
    state = OPTIMIZER_STATE_BYTES.get(optimizer)
    per_param = 2 * DTYPE_BYTES[dtype] if state is None else state
    return weights + weights + float(shape.num_params) * per_param


def detect_device_count() -> int:
    """GPUs visible through NVML (0 without a driver, a GPU or pynvml: NVML raises then)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU, or no pynvml
        return 0


def detect_device_memory() -> tuple[str, float | None]:
    """The memory of the device a run would use: (`"cuda:0 <name>"`, bytes) or (`"cpu"`, RAM bytes).

    `TUNEBENCH_DEVICE_MEMORY_GB` (a number) overrides detection, to plan for another machine's GPU.
    Uses NVML when a GPU driver is present (it raises without one, which is caught); otherwise the
    machine's RAM through psutil. Returns (`"unknown"`, None) when neither is available.
    """
    import os

    planned = os.environ.get("TUNEBENCH_DEVICE_MEMORY_GB")
    if planned:
        try:
            return "planned device", float(planned) * GiB
        except ValueError:
            raise MemoryEstimateError(
                f"TUNEBENCH_DEVICE_MEMORY_GB={planned!r} is not a number of GiB; set e.g. 80 or unset it"
            ) from None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            return f"cuda:0 {name}", float(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU, or no pynvml: fall back to RAM
        pass
    try:
        import psutil

        return "cpu", float(psutil.virtual_memory().total)
    except Exception:
        return "unknown", None
