"""The demo's result, measured: held-out exact match of the base model and after the default demo run.

    .venv/bin/python bench/demo_result.py [--home DIR] [--batch-size 16] [--limit N]

What it does, with the public commands only (each is what a user would type):
1. `tunebench run sft --config demo/smollm2_135m_lora`: the shipped demo config, unchanged, on CPU
   (`CUDA_VISIBLE_DEVICES=""`; the config's `device: auto` then picks the CPU), in a fresh
   `TUNEBENCH_HOME` (`bench/out/demo_home-<time>`, or `--home DIR`, where a completed demo run is
   reused and scores already stored with it are not computed again).
2. `tunebench eval RUN --tasks demo_em --chat`: the run's last checkpoint on the held-out demo task
   (100 problems never trained on, `configs/eval/tasks/demo_em.yaml`; exact match of the final
   answer, strict `#### answer` and the last number), with the chat template the demo trains with;
   the same with `--base` for the model the run started from (stored with the run as its base, so
   Compare shows both).
3. `tunebench eval RUN --tasks arith_mc` (and `--base`): the shipped multiple-choice task
   (log-likelihood of each choice, its documented default: no chat template).
4. Writes `bench/out/demo_result.json` and prints a Markdown table, the run's wall time, tokens/s,
   the Recipe screen's time estimate for the config, and the machine line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's engine/workbench, not an installed copy
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ itself, for machine_info
from machine_info import machine_line  # noqa: E402

OUT = REPO / "bench" / "out"
CONFIG = "demo/smollm2_135m_lora"
TASKS = (("demo_em", True), ("arith_mc", False))  # (task, with the chat template)
SHOWN = (
    ("demo_em", "exact_match,strict-match", "demo held-out exact match (#### answer)"),
    ("demo_em", "exact_match,flexible-extract", "demo held-out exact match (last number)"),
    ("arith_mc", "acc", "arith_mc accuracy"),
    ("arith_mc", "acc_norm", "arith_mc accuracy (length-normalised)"),
)


def tunebench(args: list[str], env: dict, *, capture: bool = False) -> str:
    """Run `tunebench ARGS` (this checkout's code) and return its stdout; exit on failure."""
    cmd = [sys.executable, "-m", "workbench.cli", *args]
    print("$ tunebench " + " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, env=env, cwd=REPO, text=True, stdout=subprocess.PIPE if capture else None)
    if done.returncode != 0:
        sys.exit(f"demo_result: `tunebench {' '.join(args)}` exited {done.returncode}")
    return done.stdout or ""


def show(run_id: str, env: dict) -> dict:
    return json.loads(tunebench(["show", run_id, "--json"], env, capture=True))


def demo_run(env: dict) -> str | None:
    """A completed run of the unchanged demo config in this home, if there is one."""
    from engine.config import find_config, parse_yaml

    shipped = parse_yaml(find_config(CONFIG).read_text())
    shipped.pop("output_dir", None)
    rows = json.loads(tunebench(["runs", "--json"], env, capture=True))
    for row in rows:
        if row.get("status") != "completed" or row.get("recipe") != "sft":
            continue
        cfg = parse_yaml(show(row["id"], env)["config"])
        cfg.pop("output_dir", None)
        if cfg == shipped:
            return row["id"]
    return None


def scores(data: dict) -> tuple[dict, dict, int | None]:
    """`(base {(task, metric): value}, trained {(task, metric): value}, trained step)`."""
    base, trained, step = {}, {}, None
    for row in data["eval_results"]:
        key = (row["task"], row["metric"])
        if row["checkpoint"] == "base":
            base[key] = row["value"]
        elif step is None or row["step"] >= step:
            if step is not None and row["step"] > step:
                trained = {}
            step = row["step"]
            trained[key] = row["value"]
    return base, trained, step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None, help="TUNEBENCH_HOME to use (default: a fresh one)")
    ap.add_argument("--batch-size", type=int, default=16, help="eval requests per forward (default 16)")
    ap.add_argument("--limit", type=int, default=None, help="first N problems per task (default: all)")
    args = ap.parse_args()
    home = args.home or OUT / time.strftime("demo_home-%Y%m%d-%H%M%S")
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TUNEBENCH_HOME=str(home.resolve()), CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    os.environ.update(TUNEBENCH_HOME=env["TUNEBENCH_HOME"])
    machine_start = machine_line()

    run_id = demo_run(env)
    if run_id is None:
        tunebench(["run", "sft", "--config", CONFIG], env)
        run_id = demo_run(env)
        if run_id is None:
            sys.exit("demo_result: the demo run did not complete; see `tunebench runs`")
    data = show(run_id, env)
    for task, chat in TASKS:
        for base in (True, False):
            have = scores(data)[0 if base else 1]
            if any(t == task for t, _ in have):
                continue  # stored by an earlier invocation
            cmd = ["eval", run_id, "--tasks", task, "--batch-size", str(args.batch_size)]
            cmd += (["--chat"] if chat else []) + (["--base"] if base else [])
            cmd += ["--limit", str(args.limit)] if args.limit else []
            start = time.perf_counter()
            tunebench(cmd, env)
            print(f"  {time.perf_counter() - start:.0f} s", file=sys.stderr)
            data = show(run_id, env)
    base, trained, step = scores(data)

    from engine.config import find_config, parse_yaml
    from workbench.run_time import estimate_run_time

    run = data["run"]
    losses, tps = data["metrics"].get("loss"), data["metrics"].get("tokens_per_sec")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    estimate = estimate_run_time(parse_yaml(find_config(CONFIG).read_text()))
    wall = (run["ended_at"] or 0) - (run["started_at"] or 0)
    result = {
        "run": run_id,
        "home": str(home),
        "config": CONFIG,
        "trained_step": step,
        "scores": [
            {"task": t, "metric": m, "label": label, "base": base.get((t, m)), "trained": trained.get((t, m))}
            for t, m, label in SHOWN
        ],
        "wall_seconds": wall,
        "first_loss": losses["values"][0] if losses else None,
        "last_loss": losses["values"][-1] if losses else None,
        "tokens_per_sec_median": sorted(tps["values"])[len(tps["values"]) // 2] if tps else None,
        "estimate_seconds": estimate.seconds,
        "estimate_detail": estimate.detail(),
        "limit": args.limit,
        "machine_at_start": machine_start,
        "machine_at_end": machine_line(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / ".demo_result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, OUT / "demo_result.json")
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    print(
        f"| score ({'first ' + str(args.limit) if args.limit else 'all'} problems) | base model | after the demo run (step {step}) |"
    )
    print("|---|---:|---:|")
    for row in result["scores"]:
        print(f"| {row['label']} | {f(row['base'])} | {f(row['trained'])} |")
    print(
        f"\nrun {run_id}: {wall / 60:.1f} min wall, loss {f(result['first_loss'])} -> {f(result['last_loss'])}, "
        f"median {f(result['tokens_per_sec_median'])} tokens/s; Recipe screen estimate "
        f"{(estimate.seconds or 0) / 60:.1f} min ({estimate.detail()})"
    )
    print(f"{machine_start}\n(at the end) {result['machine_at_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
