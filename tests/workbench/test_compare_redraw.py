"""Redraw cost of the plots: downsampling keeps what the eye needs; a redraw that changes nothing
does not draw the frame again (counted by the plot's `builds`) while new data or a new size does;
Compare's other metrics are built by the plot's worker and match cold builds; the widget paints the
renderer's frame (tests/workbench/widgets/test_braille.py has its golden text) in the theme's colours."""

from __future__ import annotations

import math
import random
import time

import pytest
from textual.app import App, ComposeResult
from textual.geometry import Region

from workbench.widgets.metric_plot import MetricPlot, downsample


def _buckets(n: int, max_points: int) -> list[range]:
    """The buckets `downsample` promises: max_points // 2 equal ones, the remainder one more."""
    count = max_points // 2
    k = n // count
    spans = [range(b * k, (b + 1) * k) for b in range(count)]
    if count * k < n:
        spans.append(range(count * k, n))
    return spans


@pytest.mark.parametrize("seed,n,max_points", [(0, 50_000, 160), (1, 12_345, 97), (2, 1_001, 40)])
def test_downsample_keeps_every_bucket_min_and_max_and_both_ends(seed, n, max_points):
    rng = random.Random(seed)
    xs = list(range(1, n + 1))
    ys = [2.0 * math.exp(-3 * i / n) + 0.1 * rng.random() for i in range(n)]
    for _ in range(5):  # one-step spikes and dips anywhere
        ys[rng.randrange(n)] = rng.choice([9.0, -4.0])
    dx, dy = downsample(xs, ys, max_points)
    kept = set(zip(dx, dy))
    for span in _buckets(n, max_points):
        lo = min(span, key=lambda i: ys[i])
        hi = max(span, key=lambda i: ys[i])
        assert (float(xs[lo]), ys[lo]) in kept and (float(xs[hi]), ys[hi]) in kept
    assert (dx[0], dy[0]) == (1.0, ys[0]) and (dx[-1], dy[-1]) == (float(n), ys[-1])
    assert dx == sorted(dx) and len(dx) <= max_points + 4


class PlotApp(App):
    def compose(self) -> ComposeResult:
        yield MetricPlot("loss", id="plot")


def _lines(plot: MetricPlot) -> list[str]:
    return ["".join(seg.text for seg in strip) for strip in plot.render_lines(Region(0, 0, *plot.outer_size))]


async def test_redraw_without_change_draws_nothing_and_size_or_data_change_rebuilds():
    rng = random.Random(0)
    steps = list(range(1, 20_001))
    a = (steps, [1 + rng.random() for _ in steps])
    b = (steps, [2 - i / 20_000 for i in steps])
    app = PlotApp()
    async with app.run_test(size=(100, 30)) as pilot:
        plot = app.query_one(MetricPlot)
        plot.builds = 0  # count from here (the empty plot was drawn on mount)
        plot.set_series({"a": a, "b": b})
        await pilot.pause()
        assert plot.builds == 1
        first = _lines(plot)
        assert any("⣿" in line or "⡇" in line for line in first), "curves drawn in braille"

        # Same curves again, an explicit repaint: nothing drawn.
        plot.set_series({"a": a, "b": b})
        plot.refresh()
        await pilot.pause()
        assert plot.builds == 1 and _lines(plot) == first

        # Another set of curves, then back to the first: only the new one is built.
        plot.set_series({"b": b})
        await pilot.pause()
        assert plot.builds == 2
        plot.set_series({"a": a, "b": b})
        await pilot.pause()
        assert plot.builds == 2 and _lines(plot) == first

        # The cached frame is what a cold build draws.
        plot.forget()
        await pilot.pause()
        assert plot.builds == 3 and _lines(plot) == first

        # A new size is a new frame, downsampled for the new width.
        await pilot.resize_terminal(70, 24)
        await pilot.pause()
        assert plot.builds == 4 and plot.size.width < 100
        assert all(len(line) == plot.outer_size.width for line in _lines(plot))

        # Live data grow in place: appending points is new data.
        a[0].append(20_001)
        a[1].append(5.0)
        plot.set_series({"a": a, "b": b})
        await pilot.pause()
        assert plot.builds == 5


async def test_compare_prepares_other_metrics_off_the_loop_and_switching_draws_nothing(tunebench_home):
    """Compare shows one metric; the plot's worker builds the other metrics' frames, so `m` finds
    each in the cache (nothing drawn on the event loop) and the prepared frame is what a cold build
    on the loop draws."""
    from workbench.app import make_app
    from workbench.screens.compare_screen import METRICS, CompareScreen, as_arrays

    rng = random.Random(1)
    steps = list(range(1, 5_001))
    runs, data = {}, {}
    for r in range(3):
        runs[f"id{r}"] = {"name": f"run-{r}", "status": "completed", "started_at": 0.0, "ended_at": 60.0}
        curves = {m: (steps, [r + 1 / (1 + i) + 0.1 * rng.random() for i in steps]) for m in METRICS}
        del curves["grad_norm"]  # a run without a metric still has a (blank) curve set that caches
        data[f"id{r}"] = as_arrays(curves)
    app = make_app(interval=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = CompareScreen(list(runs))
        screen.load = lambda run_ids, sweep=None: None  # data from memory, not the tracker
        app.push_screen(screen)
        await pilot.pause()
        screen.show(runs, data)
        plot = screen.query_one("#compare-plot", MetricPlot)
        plot.builds = 0  # count from here, as the curves are shown
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert plot.prepared >= len(METRICS) - 1, "the worker built the other metrics"
        assert plot.builds <= 2, "only the shown metric is built on the loop (at most once more on a resize)"
        built = plot.builds
        shown = {}
        for _ in METRICS:
            await pilot.press("m")
            await pilot.pause()
            shown[screen.metric] = _lines(plot)
        assert screen.metric == "loss" and plot.builds == built, "every switch was a cache hit"
        for metric in METRICS:  # the same pictures built cold on the loop
            plot.forget()
            screen.metric = metric
            screen.redraw_plot()
            await pilot.pause()
            assert _lines(plot) == shown[metric], metric


async def test_closing_compare_while_the_plot_worker_builds_ends_it_cleanly(tunebench_home):
    from textual.worker import WorkerState

    from workbench.app import make_app
    from workbench.screens.compare_screen import METRICS, CompareScreen, as_arrays

    rng = random.Random(2)
    steps = list(range(1, 50_001))
    noise = [rng.random() for _ in steps]
    runs = {f"id{r}": {"name": f"run-{r}", "status": "completed"} for r in range(3)}
    data = {rid: as_arrays({m: (steps, noise) for m in METRICS}) for rid in runs}
    app = make_app(interval=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = CompareScreen(list(runs))
        screen.load = lambda run_ids, sweep=None: None
        app.push_screen(screen)
        await pilot.pause()
        screen.show(runs, data)
        plot = screen.query_one("#compare-plot", MetricPlot)
        worker = plot.prepare([screen.curves(m) for m in METRICS[1:]])
        await pilot.press("q")  # back to Runs while the worker draws noisy bands
        await app.workers.wait_for_complete()
        assert worker is not None and worker.state in (
            WorkerState.CANCELLED,
            WorkerState.SUCCESS,
        )  # not ERROR
        assert not isinstance(app.screen, CompareScreen)


async def _laid_out(pilot, plot: MetricPlot) -> None:
    """Wait (up to a generous deadline) until the plot has its size and painted something."""
    deadline = time.monotonic() + 30
    while not (plot.size.height and any(line.strip() for line in _inner_text(plot))):
        assert time.monotonic() < deadline, "the plot was never laid out"
        await pilot.pause(0.05)


def _inner_text(plot: MetricPlot) -> list[str]:
    """The painted lines inside the plot's border."""
    return [line[1:-1] for line in _lines(plot)[1:-1]]


@pytest.mark.parametrize("app_theme", ["textual-dark", "textual-light", "ansi-dark"])
async def test_plot_paints_the_renderer_frame_in_the_theme_colours(app_theme):
    """Inside its border the plot paints exactly the renderer's frame of the (downsampled) curves;
    each curve's cells are in its theme colour (the theme's primary, then success), axes and tick
    labels in the muted foreground; another theme repaints in its colours."""
    from textual.color import Color

    from workbench.widgets.braille import render_plot
    from workbench.widgets.metric_plot import _downsample, palette, point_budget

    rng = random.Random(4)
    steps = list(range(1, 20_001))
    series = {
        "r0": (steps, [1 + rng.random() for _ in steps]),
        "r1": (steps, [2 - i / 20_000 for i in steps]),
    }
    app = PlotApp()
    app.theme = app_theme
    async with app.run_test(size=(110, 30)) as pilot:
        plot = app.query_one(MetricPlot)
        plot.set_series(series)
        await _laid_out(pilot, plot)
        width, height = plot.size
        curves = [_downsample(xs, ys, point_budget(width)) for xs, ys in series.values()]
        frame = render_plot(curves, list(series), width, height)
        assert _inner_text(plot) == frame.lines
        styles = palette(app.theme_variables)
        wanted = {k: styles[k].foreground.rich_color for k in (0, 1)}
        seen = {0: 0, 1: 0}
        strips = plot.render_lines(Region(0, 0, *plot.outer_size))[1:-1]
        for strip, runs in zip(strips, frame.spans):
            segments, x = [], -1  # (start, end, segment) within the border
            for seg in strip:
                segments.append((x, x + len(seg.text), seg))
                x += len(seg.text)
            for start, end, role in runs:
                if role in wanted:
                    for s0, e0, seg in segments:
                        if s0 < end and start < e0 and seg.text.strip():
                            assert seg.style.color == wanted[role], (app_theme, role, seg)
                            seen[role] += 1
        assert seen[0] and seen[1], "both curves painted"
        primary = Color.parse(app.theme_variables["primary"])
        assert wanted[0] == (app.background_colors[0] + primary if primary.a < 1 else primary).rich_color


async def test_empty_plot_says_no_data_and_a_theme_change_repaints():
    app = PlotApp()
    async with app.run_test(size=(60, 16)) as pilot:
        plot = app.query_one(MetricPlot)
        await _laid_out(pilot, plot)
        assert any("loss: no data yet" in line for line in _inner_text(plot))
        plot.set_series({"a": ([1, 2, 3], [3.0, 1.0, 2.0])})
        await _laid_out(pilot, plot)
        dark = plot.render_lines(Region(0, 0, *plot.outer_size))
        builds = plot.builds
        app.theme = "textual-light"
        deadline = time.monotonic() + 30
        while plot.builds == builds and time.monotonic() < deadline:
            await pilot.pause(0.05)
        light = plot.render_lines(Region(0, 0, *plot.outer_size))
        assert plot.builds == builds + 1, "a new theme is a new frame"
        assert [s.text for line in dark for s in line] == [s.text for line in light for s in line]
        assert [s.style for line in dark for s in line] != [s.style for line in light for s in line]
