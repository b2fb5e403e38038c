"""Probe: textual-plot (PyPI) drawing Compare's curves, timed like bench/workbench_latency.py.

What decided the plot renderer (docs/BENCHMARKS.md, Workbench). textual-plot is not a tunebench
dependency; install it next to the venv and point `--path` at it:

    .venv/bin/python -m pip install --no-deps --target /tmp/tplot textual-plot==0.10.1 textual-hires-canvas==0.14.0
    .venv/bin/python bench/textual_plot_probe.py --path /tmp/tplot

5 curves of 50,000 steps (smooth: exponential decay plus a little noise; noisy: uniform noise over
the whole height), each downsampled with our min/max-per-column `downsample` to 2 points per pixel
column, drawn as braille lines. One first draw = clearing the widget, adding the curves and turning
the widget and its canvases into lines (`render_lines`). Prints medians (wall ms, CPU ms) per kind
and size.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import numpy as np

SIZES = (((160, 48), (158, 20)), ((240, 70), (238, 29)))  # terminal, Compare's plot in it


def curves(kind: str, steps: int = 50_000, runs: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    xs = np.arange(1, steps + 1, dtype=np.float64)
    if kind == "smooth":
        return [
            (xs, 0.8 + 0.1 * r + 2.0 * np.exp(-5 * xs / steps) + 0.05 * rng.random(steps))
            for r in range(runs)
        ]
    return [(xs, 1 + rng.random(steps)) for _ in range(runs)]


async def first_draws(terminal: tuple[int, int], plot: tuple[int, int], repeats: int) -> dict:
    from textual.app import App
    from textual.geometry import Region
    from textual_plot import HiResMode, PlotWidget

    from workbench.widgets.metric_plot import downsample

    class Probe(App):
        CSS = f"PlotWidget {{ width: {plot[0]}; height: {plot[1]}; }}"

        def compose(self):
            yield PlotWidget()

    colours = ["red", "green", "blue", "yellow", "magenta"]
    result = {}
    app = Probe()
    async with app.run_test(size=terminal) as pilot:
        await pilot.pause(0.2)
        widget = app.query_one(PlotWidget)
        for kind in ("smooth", "noisy"):
            data = curves(kind)
            times = []
            for _ in range(repeats):
                t, c = time.perf_counter(), time.thread_time()
                widget.clear()
                for k, (x, y) in enumerate(data):
                    px, py = downsample(x, y, 4 * plot[0])
                    widget.plot(px, py, line_style=colours[k], hires_mode=HiResMode.BRAILLE, label=f"run-{k}")
                widget.render()  # draws the datasets into the canvases
                for child in widget.query("*"):
                    child.render_lines(Region(0, 0, *child.size))
                times.append((time.perf_counter() - t, time.thread_time() - c))
                await pilot.pause()
            result[kind] = tuple(statistics.median(v[i] for v in times) * 1000 for i in (0, 1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", required=True, help="folder textual-plot was installed into (--target)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    sys.path.insert(0, args.path)
    for terminal, plot in SIZES:
        for kind, (wall, cpu) in asyncio.run(first_draws(terminal, plot, args.repeats)).items():
            print(
                f"{terminal[0]}x{terminal[1]} (plot {plot[0]}x{plot[1]}) {kind}: {wall:.1f} ms wall, {cpu:.1f} ms CPU"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
