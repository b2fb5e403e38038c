"""Workbench latency: time from `tunebench` to the first painted frame, and Compare redraw time.

    .venv/bin/python bench/workbench_latency.py [--repeats 7] [--out docs/BENCHMARKS.md]

1. First frame: a fresh Python process in a pseudo-terminal runs what the `tunebench` console script
   runs (`workbench.cli.build_parser()` with every subcommand registered, then the app) and records
   the time of Textual's `Ready` event (sent once the first frame is on the terminal). Measured from
   just before the process is spawned, so interpreter start-up and imports are included. Goal < 1 s.
2. Compare redraw: the Compare screen with 5 runs x 50,000 steps of loss (and 4 other metrics) in a
   160x48 headless terminal; one redraw = switching the plotted metric (downsampling every curve
   afresh + building the plotext figure) and rendering it. Also the cached case (same data, a
   repaint). Goal < 50 ms.
Prints a Markdown block; `--out FILE` also replaces the "Workbench" section of that file.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import pty
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys, time
from workbench.cli import build_parser
build_parser()  # what `tunebench` does before opening the app: every subcommand registered
from workbench.app import TunebenchApp

class FirstFrame(TunebenchApp):
    def on_ready(self) -> None:
        with open(sys.argv[1], "w") as fh:
            fh.write(repr(time.time()))
        self.exit()

FirstFrame().run()
"""


def first_frame_once(home: Path) -> tuple[float, float]:
    """(wall seconds from spawning the process to its first painted frame (Textual `Ready`), CPU
    seconds the process used in all — start-up, first frame and exit; what an idle core would take)."""
    stamp = home / "ready.txt"
    stamp.unlink(missing_ok=True)
    master, slave = pty.openpty()
    env = dict(os.environ, TUNEBENCH_HOME=str(home), TERM="xterm-256color", COLUMNS="120", LINES="36")
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(stamp)], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO
    )
    os.close(slave)
    deadline = time.monotonic() + 60
    output = b""
    while proc.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                output = (output + os.read(master, 65536))[-4000:]  # drain so the app never blocks
            except OSError:
                break
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    os.close(master)
    if not stamp.exists():
        raise RuntimeError(f"the app did not report its first frame; it wrote: {output[-800:]!r}")
    return float(stamp.read_text()) - t0, usage.ru_utime + usage.ru_stime


def synthetic_runs(n_runs: int, steps: int) -> tuple[dict, dict]:
    """`n_runs` finished runs with `steps` steps of loss, lr, tokens/s, memory and grad norm."""
    rng = random.Random(0)
    runs, data = {}, {}
    xs = list(range(1, steps + 1))
    for r in range(n_runs):
        rid = f"run{r}"
        runs[rid] = {"name": f"run-{r}", "status": "completed", "started_at": 0.0, "ended_at": 3600.0 + r}
        end = 0.8 + 0.1 * r
        data[rid] = {
            "loss": (xs, [end + 2.0 * math.exp(-5 * i / steps) + 0.05 * rng.random() for i in xs]),
            "lr": (xs, [3e-4 * min(1, i / 500) * (0.5 + 0.5 * math.cos(math.pi * i / steps)) for i in xs]),
            "tokens_per_sec": (xs, [2000 + 50 * rng.random() for _ in xs]),
            "mem_peak_gb": (xs, [10 + 0.001 * i / steps for i in xs]),
            "grad_norm": (xs, [1 + rng.random() for _ in xs]),
        }
    from workbench.screens.compare import as_arrays

    return runs, {rid: as_arrays(series) for rid, series in data.items()}


async def compare_redraw(n_runs: int = 5, steps: int = 50_000, repeats: int = 25) -> dict[str, float]:
    """Median ms (wall and main-thread CPU) of a Compare redraw with new data (metric switch) and of a
    cached repaint."""
    from workbench.app import make_app
    from workbench.screens.compare import METRICS, CompareScreen
    from workbench.widgets.metric_plot import MetricPlot

    runs, data = synthetic_runs(n_runs, steps)
    app = make_app(interval=3600)
    fresh, cached, fresh_cpu, cached_cpu = [], [], [], []
    with tempfile.TemporaryDirectory() as home:
        os.environ["TUNEBENCH_HOME"] = home
        async with app.run_test(size=(160, 48)) as pilot:
            screen = CompareScreen(list(runs))
            screen.load = lambda: None  # the data comes from memory here, not the tracker
            app.push_screen(screen)
            await pilot.pause(0.2)
            screen.show(runs, data)
            await pilot.pause(0.2)
            plot = screen.query_one("#compare-plot", MetricPlot)
            for i in range(repeats):
                screen.metric = METRICS[i % len(METRICS)]
                t, c = time.perf_counter(), time.thread_time()
                screen.redraw_plot()
                plot.render()
                fresh.append(time.perf_counter() - t)
                fresh_cpu.append(time.thread_time() - c)
                t, c = time.perf_counter(), time.thread_time()
                plot.replot()
                plot.render()
                cached.append(time.perf_counter() - t)
                cached_cpu.append(time.thread_time() - c)
    ms = {"fresh": fresh, "cached": cached, "fresh_cpu": fresh_cpu, "cached_cpu": cached_cpu}
    return {k: statistics.median(v) * 1000 for k, v in ms.items()}


def report(ff: list[tuple[float, float]], redraw: dict[str, float], repeats: int) -> str:
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    wall = [w for w, _ in ff]
    cpu = statistics.median(c for _, c in ff)
    med = statistics.median(wall)

    def verdict(x: float, goal: float) -> str:
        return "met" if x < goal else "missed"

    return "\n".join(
        [
            "## Workbench",
            "",
            f"`.venv/bin/python bench/workbench_latency.py --repeats {repeats}` ({date}; 2-core CPU box shared with",
            f"other jobs, load average {os.getloadavg()[0]:.1f} when measured, so wall times include waiting for a",
            "core; the CPU-time column is what the work itself costs).",
            "",
            "| measure | wall (median) | CPU time (median) | goal |",
            "|---|---|---|---|",
            f"| `tunebench` to first painted frame, pty, {len(ff)} fresh processes (wall min {min(wall):.2f} s, max {max(wall):.2f} s; CPU includes exit) | {med:.2f} s ({verdict(med, 1)}) | {cpu:.2f} s ({verdict(cpu, 1)}) | < 1 s |",
            f"| Compare redraw, 5 runs x 50,000 steps, new metric (downsample + plotext) | {redraw['fresh']:.1f} ms ({verdict(redraw['fresh'], 50)}) | {redraw['fresh_cpu']:.1f} ms ({verdict(redraw['fresh_cpu'], 50)}) | < 50 ms |",
            f"| Compare repaint, same data (cached downsample) | {redraw['cached']:.1f} ms ({verdict(redraw['cached'], 50)}) | {redraw['cached_cpu']:.1f} ms ({verdict(redraw['cached_cpu'], 50)}) | < 50 ms |",
            "",
            "Curves are downsampled with numpy to one point per terminal column (min and max per bucket, so",
            "spikes survive) before plotext draws them; torch and datasets are imported only inside workers.",
            "",
        ]
    )


def replace_section(path: Path, section: str) -> None:
    """Replace (or append) the `## Workbench` section of `path`, atomically."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "## Workbench"), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        new = "".join(lines[:start]) + section + ("\n" if end < len(lines) else "") + "".join(lines[end:])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes for the first-frame time")
    parser.add_argument("--out", type=Path, help="Markdown file whose '## Workbench' section is replaced")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        first_frame_once(Path(home))  # warm the OS file cache once; not counted
        ff = [first_frame_once(Path(home)) for _ in range(args.repeats)]
    redraw = asyncio.run(compare_redraw())
    text = report(ff, redraw, args.repeats)
    print(text)
    if args.out:
        replace_section(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
