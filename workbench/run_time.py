"""The expected time of a configured run on this machine (the Recipe screen's time line).

Reads what `engine.training.time_estimate` needs from a run config: the model's shape (as the memory
estimate sizes it), the method, rows per optimizer step, the run's length in steps (`epochs`,
`max_steps_per_epoch`, and the rows of a dataset whose size the config states, `n` of the demo
dataset), validation batches, and the device and dtype the run would use. Blocks for the ~0.3 s
matmul probe the first time each day: call it from a worker thread.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import UserError

# Recipes whose optimizer step is `batch x accumulation` rows of `seq_len` tokens through one model.
TIMED_RECIPES = ("sft",)


def _positive(value: Any, default: int | None) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else default


def dataset_rows(cfg: dict[str, Any]) -> int | None:
    """Rows of the config's dataset when the config states them (`dataset.n`, the demo dataset's
    default of 3000 when it is the demo builder); None otherwise."""
    node = cfg.get("dataset") if isinstance(cfg.get("dataset"), dict) else {}
    if _positive(node.get("n"), None):
        return node["n"]
    if str(node.get("_component_", "")).endswith("demo_dataset"):
        return 3000  # engine.data.demo_dataset's default n
    return None


def run_device(cfg: dict[str, Any], device_count: int) -> str:
    """`cuda` or `cpu`: the config's `device` (`auto`: cuda when a GPU is here)."""
    device = str(cfg.get("device") or "auto")
    if device == "auto":
        return "cuda" if device_count else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def estimate_run_time(
    cfg: dict[str, Any], nproc: int = 1, *, recipe: str | None = None, device_count: int = 0
) -> Any:
    """The run's `TimeEstimate`. Raises `UserError` with the reason when there is none (another
    recipe, an unknown model shape); `MemoryEstimateError` for a bad option."""
    from engine.training.memory_estimate import ModelShape
    from engine.training.time_estimate import estimate_time, matmul_rate, steps_of_run
    from workbench.recipe_options import training_options
    from workbench.services import _model_shape_card

    recipe = recipe or "sft"
    if recipe not in TIMED_RECIPES:
        raise UserError(f"no time estimate for {recipe} runs yet (sft only)")
    shape = ModelShape.from_card(_model_shape_card(cfg, "model"))
    opts = training_options(cfg, nproc, recipe)
    accumulation = _positive(cfg.get("gradient_accumulation_steps"), 1) or 1
    data_parallel = max(1, opts["nproc"] // max(1, int(cfg.get("tensor_parallel_dim") or 1)))
    rows_per_step = opts["batch_size"] * accumulation * data_parallel
    validation = cfg.get("validation") if isinstance(cfg.get("validation"), dict) else {}
    rows = dataset_rows(cfg)
    fraction = validation.get("fraction") if isinstance(validation.get("fraction"), (int, float)) else 0.0
    if rows is not None:
        rows -= round(rows * float(fraction))
    steps = steps_of_run(
        rows=rows,
        rows_per_step=rows_per_step,
        epochs=_positive(cfg.get("epochs"), 1) or 1,
        max_steps_per_epoch=_positive(cfg.get("max_steps_per_epoch"), None),
    )
    validation_rows = 0
    every = _positive(validation.get("every_n_steps"), None)
    if fraction and every and steps:
        batches = _positive(validation.get("max_batches"), 1) or 1
        validation_rows = (steps // every) * batches * opts["batch_size"] * data_parallel
    device = run_device(cfg, device_count)
    dtype = "fp32" if opts["dtype"] in ("fp32", "float32") else "bf16"
    flops, source = matmul_rate(device, dtype)
    if device == "cuda":  # one GPU per rank: the ranks' rates add up
        flops *= max(1, min(opts["nproc"], device_count))
    return estimate_time(
        shape,
        method=opts["method"],
        seq_len=opts["seq_len"],
        rows_per_step=rows_per_step,
        steps=steps,
        matmul_flops=flops,
        device=device,
        source=source,
        activation_checkpointing=opts["activation_checkpointing"],
        validation_rows=validation_rows,
    )
