"""A small, genuine recipe for launcher and CLI tests: least-squares regression trained by SGD.

    torchrun --standalone --nproc_per_node N -m lsq_recipe --config FILE [key=value ...]

(with this folder on PYTHONPATH). It behaves as the launcher contract asks of every recipe
(docs/ARCHITECTURE.md): metrics through `MetricLogger` every step, a checkpoint every
`checkpoint_every` steps under `output_dir/checkpoints/step_<N>/` (temp folder + rename), SIGTERM ->
checkpoint + exit 0, `resume: true` -> continue from the newest checkpoint with the same data order
(marked and checked as the engine's checkpoints are, `engine.checkpoint.provenance`),
a non-finite loss -> `loss is nan at step N` on stderr + exit 1, a bad config -> one line + exit 2.
With several ranks, gradients are averaged with `all_reduce` over gloo (each rank its own data shard).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from engine.checkpoint.layout import RECIPE_STATE, latest_checkpoint
from engine.checkpoint.provenance import check_written_here, mark_written
from engine.config import ConfigError, load_config
from engine.tracking import MetricLogger
from engine.training.distributed import shutdown

CONFIG_KEYS = {
    "steps": "optimizer steps to run",
    "lr": "SGD learning rate",
    "dim": "number of features",
    "batch_size": "samples per step per rank",
    "seed": "seed of the data and the initial weights",
    "checkpoint_every": "save a checkpoint every N steps (0: only at the end)",
    "step_delay_s": "pause after each step, so tests can act mid-run",
    "output_dir": "where checkpoints go (the launcher sets runs/<id>)",
    "resume": "continue from the newest checkpoint under output_dir",
}
DEFAULTS = {
    "lr": 0.05,
    "dim": 8,
    "batch_size": 16,
    "seed": 0,
    "checkpoint_every": 0,
    "step_delay_s": 0.0,
    "resume": False,
}


def _read_config(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="lsq_recipe")
    parser.add_argument("--config", required=True)
    args, overrides = parser.parse_known_args(argv)
    cfg = {**DEFAULTS, **load_config(args.config, overrides)}
    for key in cfg:
        if key not in CONFIG_KEYS:
            raise ConfigError(
                "unknown key for lsq_recipe", hint=f"use one of {', '.join(CONFIG_KEYS)}", field=key
            )
    if not isinstance(cfg.get("steps"), int) or cfg["steps"] < 1:
        raise ConfigError("must be a positive integer", hint="set steps=100 for example", field="steps")
    if "output_dir" not in cfg:
        raise ConfigError("missing", hint="set output_dir=DIR", field="output_dir")
    return cfg


def _latest(output_dir: Path) -> Path | None:
    return latest_checkpoint(output_dir)  # the engine's definition of a complete checkpoint


def _save(output_dir: Path, step: int, w: torch.Tensor, gen: torch.Generator, log: MetricLogger) -> None:
    ckpts = output_dir / "checkpoints"
    ckpts.mkdir(parents=True, exist_ok=True)
    tmp = ckpts / f".tmp_step_{step}"
    tmp.mkdir(exist_ok=True)
    mark_written(tmp, ckpts / f"step_{step}")  # this home's mark: resume refuses folders without it
    torch.save(
        {"step": step, "w": w.detach().clone(), "rng": gen.get_state()}, tmp / RECIPE_STATE
    )  # written last, as save_checkpoint does
    os.replace(tmp, ckpts / f"step_{step}")
    log.event(step, "checkpoint", f"checkpoints/step_{step}")


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg = _read_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"lsq_recipe: {exc}", file=sys.stderr)
        return 2
    if world > 1:
        dist.init_process_group("gloo")
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    log = MetricLogger.from_env(rank=rank)
    out = Path(cfg["output_dir"])
    d, bs = cfg["dim"], cfg["batch_size"]

    # the problem: y = X w* + noise, X [bs, d] drawn per step from a seeded generator (per rank)
    torch.manual_seed(cfg["seed"])
    w_true = torch.randn(d)  # [d]
    w = torch.zeros(d, requires_grad=True)  # [d]
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank + 1)
    step = 0
    if cfg["resume"] and (ck := _latest(out)) is not None:
        try:
            check_written_here(ck)  # before unpickling anything from it
        except ConfigError as exc:
            print(f"lsq_recipe: {exc}", file=sys.stderr)
            return 2
        state = torch.load(ck / RECIPE_STATE)
        step = state["step"]
        with torch.no_grad():
            w.copy_(state["w"])
        gen.set_state(state["rng"])
    opt = torch.optim.SGD([w], lr=cfg["lr"])
    log.set_progress(step, cfg["steps"])
    code = 0
    while step < cfg["steps"]:
        t0 = time.perf_counter()
        x = torch.randn(bs, d, generator=gen)  # [bs, d]
        y = x @ w_true + 0.01 * torch.randn(bs, generator=gen)  # [bs]
        loss = ((x @ w - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if world > 1:
            dist.all_reduce(w.grad, op=dist.ReduceOp.AVG)
            dist.all_reduce(loss_t := loss.detach().clone(), op=dist.ReduceOp.AVG)
            loss_v = float(loss_t)
        else:
            loss_v = float(loss.detach())
        step += 1
        if not math.isfinite(loss_v):
            log.event(step, "nan", f"loss is {loss_v} at step {step}")
            log.close()
            print(f"loss is nan at step {step}", file=sys.stderr)
            code = 1
            break
        gnorm = float(w.grad.norm())
        opt.step()
        dt = time.perf_counter() - t0
        if rank == 0:
            log.log(
                step, {"loss": loss_v, "lr": cfg["lr"], "grad_norm": gnorm, "tokens_per_sec": bs * world / dt}
            )
        log.log(step, {"mem_peak_gb": _rss_gb()}, rank=rank)
        log.set_progress(step, cfg["steps"])
        if cfg["step_delay_s"]:
            time.sleep(cfg["step_delay_s"])
        every = cfg["checkpoint_every"]
        asked = stop["asked"]
        if world > 1:
            flag = torch.tensor([1.0 if asked else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            asked = bool(flag.item())
        if rank == 0 and ((every and step % every == 0) or asked or step == cfg["steps"]):
            _save(out, step, w, gen, log)
        if asked:
            break
    log.close()
    shutdown(code)  # barrier, destroy the group, record the code for the supervisor, os._exit


def _rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


if __name__ == "__main__":
    shutdown(main())
