"""Evaluation throughput: tunebench's lm-eval model (`--model tunebench`) versus lm-eval's own `hf`
backend (transformers) on the same checkpoint and tasks, CPU, one process.

    .venv/bin/python bench/eval_throughput.py [--model demo|DIR] [--tasks arith_mc,gsm8k_local]
        [--limit 16] [--batch-size 8] [--max-gen-toks 96] [--threads 1]

Weights: the embedded demo (SmolLM2-135M-Instruct, float32) unless `--model` names a folder. Each
task runs through `lm_eval.simple_evaluate` once per backend (tunebench first, then hf; a warm-up
request on each backend first), same limit, batch size, generation budget and thread count. Timed:
the seconds spent inside the model's request methods (`loglikelihood`, `generate_until`, ...), so
task loading is excluded for both. Reports requests/s per task and backend, the ratio tunebench / hf
and whether the scores agree; writes `bench/out/eval_throughput.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

METHODS = ("loglikelihood", "loglikelihood_rolling", "generate_until")


def _timed(lm, stats: dict):
    """Wrap `lm`'s request methods: count requests and the seconds spent answering them."""
    for name in METHODS:
        method = getattr(lm, name)

        def wrapper(requests, *args, _m=method, **kwargs):
            start = time.perf_counter()
            out = _m(requests, *args, **kwargs)
            stats["seconds"] += time.perf_counter() - start
            stats["requests"] += len(requests)
            return out

        setattr(lm, name, wrapper)
    return lm


def _warm(lm) -> None:
    from lm_eval.api.instance import Instance

    lm.loglikelihood([Instance("loglikelihood", {}, ("Question: 1+1?\nAnswer:", " 2"), 0)], disable_tqdm=True)


def run_task(lm, task: str, *, limit: int, max_gen_toks: int) -> tuple[dict, dict]:
    import lm_eval

    from engine.eval.runner import flatten_scores, task_manager
    from engine.eval.tasks import resolve_task_specs

    stats = {"requests": 0, "seconds": 0.0}
    results = lm_eval.simple_evaluate(
        model=_timed(lm, stats),
        tasks=resolve_task_specs([task]),
        limit=limit,
        gen_kwargs={"max_gen_toks": max_gen_toks},
        task_manager=task_manager((), include_defaults=False),
        bootstrap_iters=0,
        log_samples=False,
    )
    for name in METHODS:
        lm.__dict__.pop(name, None)
    return stats, {f"{s.metric}": s.value for s in flatten_scores(results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--tasks", default="arith_mc,gsm8k_local")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-gen-toks", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)

    from lm_eval.models.huggingface import HFLM

    from engine.eval import TunebenchLM

    if args.model == "demo":
        from engine.models.demo_model import demo_model_dir

        folder, label = Path(demo_model_dir()), "SmolLM2-135M-Instruct (demo, float32)"
    else:
        folder, label = Path(args.model), args.model
    ours = TunebenchLM(pretrained=folder, batch_size=args.batch_size, dtype="float32", device="cpu")
    hf = HFLM(pretrained=str(folder), batch_size=args.batch_size, dtype="float32", device="cpu")
    _warm(ours)
    _warm(hf)
    report = {
        "model": label,
        "limit": args.limit,
        "batch_size": args.batch_size,
        "max_gen_toks": args.max_gen_toks,
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
        "tasks": {},
    }
    for task in [t for t in args.tasks.split(",") if t]:
        row = {}
        for name, lm in (("tunebench", ours), ("hf", hf)):
            stats, scores = run_task(lm, task, limit=args.limit, max_gen_toks=args.max_gen_toks)
            row[name] = {**stats, "requests_per_s": stats["requests"] / stats["seconds"], "scores": scores}
        row["ratio"] = row["tunebench"]["requests_per_s"] / row["hf"]["requests_per_s"]
        row["scores_equal"] = row["tunebench"]["scores"] == row["hf"]["scores"]
        report["tasks"][task] = row
        print(
            f"{task}: {row['tunebench']['requests']} requests | tunebench {row['tunebench']['requests_per_s']:.2f} req/s "
            f"| hf {row['hf']['requests_per_s']:.2f} req/s | ratio {row['ratio']:.2f}x | scores equal {row['scores_equal']} "
            f"{row['tunebench']['scores']}",
            flush=True,
        )
    out = Path(__file__).resolve().parent / "out" / "eval_throughput.json"
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
