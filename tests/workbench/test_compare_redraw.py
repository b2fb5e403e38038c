"""Redraw cost of the plots: downsampling keeps what the eye needs; a redraw that changes nothing
does not run plotext again (counted on plotext's `_build_matrix`) while new data or a new size does;
Compare's other metrics are built by the plot's worker and match cold builds; the numpy fast path
of plotext draws byte-identical figures."""

from __future__ import annotations

import math
import random

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


def _count_builds(plot: MetricPlot) -> list[int]:
    """Wrap plotext's `_build_matrix` (the expensive call: the figure drawn into its character
    matrix, what both `build` and `figure_text` run) with a counter."""
    calls = [0]
    build = plot.plt._build_matrix

    def counted():
        calls[0] += 1
        return build()

    plot.plt._build_matrix = counted
    return calls


def _lines(plot: MetricPlot) -> list[str]:
    return ["".join(seg.text for seg in strip) for strip in plot.render_lines(Region(0, 0, *plot.outer_size))]


async def test_redraw_without_change_skips_plotext_and_size_or_data_change_rebuilds():
    rng = random.Random(0)
    steps = list(range(1, 20_001))
    a = (steps, [1 + rng.random() for _ in steps])
    b = (steps, [2 - i / 20_000 for i in steps])
    app = PlotApp()
    async with app.run_test(size=(100, 30)) as pilot:
        plot = app.query_one(MetricPlot)
        calls = _count_builds(plot)
        plot.set_series({"a": a, "b": b})
        await pilot.pause()
        assert calls[0] == 1
        first = _lines(plot)
        assert any("⣿" in line or "⡇" in line for line in first), "curves drawn in braille"

        # Same curves again, an explicit repaint: no plotext.
        plot.set_series({"a": a, "b": b})
        plot.refresh()
        await pilot.pause()
        assert calls[0] == 1 and _lines(plot) == first

        # Another set of curves, then back to the first: only the new one is built.
        plot.set_series({"b": b})
        await pilot.pause()
        assert calls[0] == 2
        plot.set_series({"a": a, "b": b})
        await pilot.pause()
        assert calls[0] == 2 and _lines(plot) == first

        # The cached frame is what a cold build draws.
        plot.forget()
        await pilot.pause()
        assert calls[0] == 3 and _lines(plot) == first

        # A new size is a new frame, downsampled for the new width.
        await pilot.resize_terminal(70, 24)
        await pilot.pause()
        assert calls[0] == 4 and plot.size.width < 100
        assert all(len(line) == plot.outer_size.width for line in _lines(plot))

        # Live data grow in place: appending points is new data.
        a[0].append(20_001)
        a[1].append(5.0)
        plot.set_series({"a": a, "b": b})
        await pilot.pause()
        assert calls[0] == 5


async def test_compare_prepares_other_metrics_off_the_loop_and_switching_draws_nothing(tunebench_home):
    """Compare shows one metric; the plot's worker builds the other metrics' frames, so `m` finds
    each in the cache (no plotext on the event loop) and the prepared frame is what a cold build
    on the loop draws."""
    from workbench.app import make_app
    from workbench.screens.compare import METRICS, CompareScreen, as_arrays

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
        screen.load = lambda: None  # data from memory, not the tracker
        app.push_screen(screen)
        await pilot.pause()
        screen.show(runs, data)
        plot = screen.query_one("#compare-plot", MetricPlot)
        calls = _count_builds(plot)
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert plot.prepared >= len(METRICS) - 1, "the worker built the other metrics"
        assert calls[0] <= 2, "only the shown metric is built on the loop (at most once more on a resize)"
        built = calls[0]
        shown = {}
        for _ in METRICS:
            await pilot.press("m")
            await pilot.pause()
            shown[screen.metric] = _lines(plot)
        assert screen.metric == "loss" and calls[0] == built, "every switch was a cache hit"
        for metric in METRICS:  # the same pictures built cold on the loop
            plot.forget()
            screen.metric = metric
            screen.redraw_plot()
            await pilot.pause()
            assert _lines(plot) == shown[metric], metric


def _plot(curves: dict[str, tuple[list, list]], width: int, height: int, marker: str, theme: str):
    """A plotext figure of `curves`; a marker "braille+fillx" / "braille+filly" also fills."""
    from textual_plotext.plot import Plot

    plt = Plot()
    marker, _, extra = marker.partition("+")
    fills = {"fillx": {"fillx": True}, "filly": {"filly": True}}.get(extra, {})
    for label, (xs, ys) in curves.items():
        plt.plot(xs, ys, label=label if len(curves) > 1 else None, marker=marker, **fills)
    if extra == "grid":  # tick positions pass through the same coordinate mapping and are flattened
        xs, ys = next(iter(curves.values()))
        plt.grid(True, True)
        plt.vline(xs[len(xs) // 2])
        plt.hline(min(ys))
    plt.plotsize(width, height)
    plt._set_size(width, height)
    plt.theme(theme)
    return plt


def _same_text(a, b) -> bool:
    """Rich texts equal in characters, styled spans (start, end, style) and text attributes."""
    attrs = ("end", "tab_size", "style", "justify", "overflow", "no_wrap")
    return (
        a.plain == b.plain
        and a.spans == b.spans
        and [getattr(a, k) for k in attrs] == [getattr(b, k) for k in attrs]
    )


def _figure_cases():
    rng = random.Random(3)
    steps = list(range(1, 4_001))
    noisy = {f"run-{r}": downsample(steps, [2000 + 50 * rng.random() for _ in steps], 200) for r in range(4)}
    smooth = {f"run-{r}": downsample(steps, [r + math.exp(-i / 900) for i in steps], 200) for r in range(3)}
    # 5 runs of 50,000 noisy steps each, as Compare's tokens/s: bands over the whole height
    big = list(range(1, 50_001))
    bands = {f"run-{r}": downsample(big, [1 + rng.random() for _ in big], 316) for r in range(5)}
    apart = {f"run-{r}": downsample(big, [r + rng.random() for _ in big], 240) for r in range(3)}
    few = {f"run-{r}": downsample(steps, [r + rng.random() for _ in steps], 24) for r in range(2)}
    return [
        (bands, 158, 18, "braille", "dark"),
        (bands, 158, 40, "braille", "clear"),
        (apart, 120, 30, "braille", "pro"),
        (noisy, 100, 20, "braille", "default"),
        (noisy, 37, 41, "braille", "matrix"),
        (noisy, 8, 4, "braille", "dark"),
        (smooth, 100, 20, "braille", "dark"),
        (smooth, 61, 13, "braille", "clear"),
        ({"one": ([1.0], [2.0])}, 40, 10, "braille", "dark"),
        ({"flat": ([1.0, 2.0, 3.0], [5.0, 5.0, 5.0])}, 40, 10, "braille", "dark"),
        ({"gap": ([1.0, 2.0, 3.0, 4.0], [1.0, float("nan"), 3.0, 2.0])}, 40, 10, "braille", "dark"),
        ({"ints": ([1, 2, 3, 4], [3, 1, 4, 1])}, 40, 10, "braille", "default"),
        (smooth, 60, 15, "dot", "dark"),  # not braille: hd_group is not used, the rest is
        (noisy, 60, 15, "hd", "clear"),  # 2 x 2 blocks: hd_group falls back to plotext's own
        (few, 30, 10, "braille+fillx", "dark"),  # filled to the axis: plotext's fill_data in between
        (few, 30, 10, "braille+filly", "clear"),
        (noisy, 70, 20, "braille+grid", "dark"),  # grid, a vertical and a horizontal line
        # labels with control characters: figure_text takes plotext's ANSI round trip
        ({"a\x1b[1mb": few["run-0"], "c\rd": few["run-1"]}, 30, 10, "braille", "dark"),
    ]


def test_plotext_fast_path_draws_the_same_figures_as_plotext():
    """With the fast path plotext prints byte-identical figures to its own code's, and
    `figure_text` (Rich text read from the figure's matrices) equals Rich parsing plotext's ANSI
    output: the same characters and the same styled spans. Noisy bands, smooth curves, one point,
    a flat line, a gap, integer data, other markers, filled curves, a grid with extra lines; several
    sizes and plotext themes."""
    import plotext._matrix as mx
    import plotext._utility as ut
    from rich.text import Text

    from workbench.widgets.metric_plot import (
        FAST_MATRIX,
        FAST_PATH,
        figure_text,
        install_plotext_fast_path,
        use_plotext_fast_path,
    )

    assert install_plotext_fast_path()
    fast = [getattr(ut, name) for name in FAST_PATH] + [getattr(mx.matrix_class, n) for n in FAST_MATRIX]
    try:
        for curves, width, height, marker, theme in _figure_cases():
            use_plotext_fast_path(False)
            original = [getattr(ut, name) for name in FAST_PATH] + [
                getattr(mx.matrix_class, n) for n in FAST_MATRIX
            ]
            assert all(a is not b for a, b in zip(original, fast)), "the originals are back"
            expected = _plot(curves, width, height, marker, theme).build()
            use_plotext_fast_path(True)
            case = (width, height, marker, theme)
            assert _plot(curves, width, height, marker, theme).build() == expected, case
            text = figure_text(_plot(curves, width, height, marker, theme))
            assert _same_text(text, Text.from_ansi(expected)), case
    finally:
        use_plotext_fast_path(True)


@pytest.mark.parametrize("app_theme", ["textual-dark", "textual-light", "ansi-dark"])
async def test_metric_plot_lines_equal_plotext_drawn_the_slow_way(app_theme, monkeypatch):
    """What the plot paints (Textual's lines: characters and styles) is the same with the fast
    path, `figure_text` and `content_from_text` as with plotext's own code, Rich parsing its ANSI
    output and Textual's `Content.from_rich_text`, for the app's dark, light and ANSI-only themes,
    noisy and smooth curves."""
    from rich.text import Text
    from textual.content import Content

    from workbench.widgets import metric_plot

    rng = random.Random(4)
    steps = list(range(1, 20_001))
    noisy = {f"r{r}": (steps, [1 + rng.random() for _ in steps]) for r in range(5)}
    smooth = {f"r{r}": (steps, [r + 1 / (1 + i) for i in steps]) for r in range(3)}
    app = PlotApp()
    app.theme = app_theme
    async with app.run_test(size=(110, 30)) as pilot:
        plot = app.query_one(MetricPlot)
        for series in (noisy, smooth):
            plot.set_series(series)
            plot.forget()
            await pilot.pause()
            region = Region(0, 0, *plot.outer_size)
            fast = [list(strip) for strip in plot.render_lines(region)]
            metric_plot.use_plotext_fast_path(False)
            monkeypatch.setattr(metric_plot, "figure_text", lambda plt: Text.from_ansi(plt.build()))
            monkeypatch.setattr(
                metric_plot,
                "content_from_text",
                lambda text, console, _: Content.from_rich_text(text, console),
            )
            try:
                plot.forget()
                slow = [list(strip) for strip in plot.render_lines(region)]
            finally:
                metric_plot.use_plotext_fast_path(True)
                monkeypatch.undo()
            assert fast == slow
            drawn = "".join(seg.text for line in fast for seg in line)
            assert ("⣿" in drawn) == (series is noisy), "noisy bands fill whole cells, smooth curves do not"


async def test_closing_compare_while_the_plot_worker_builds_ends_it_cleanly(tunebench_home):
    from textual.worker import WorkerState

    from workbench.app import make_app
    from workbench.screens.compare import METRICS, CompareScreen, as_arrays

    rng = random.Random(2)
    steps = list(range(1, 50_001))
    noise = [rng.random() for _ in steps]
    runs = {f"id{r}": {"name": f"run-{r}", "status": "completed"} for r in range(3)}
    data = {rid: as_arrays({m: (steps, noise) for m in METRICS}) for rid in runs}
    app = make_app(interval=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = CompareScreen(list(runs))
        screen.load = lambda: None
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


def test_fast_canvas_coordinates_equal_plotext_on_ties_and_random_values():
    """The numpy `get_matrix_data` gives plotext's own coordinates, also for values that land on
    plotext's 8-digit rounding ties (x.5e-8) and for random values over several limits and widths;
    other inputs (integers, NaN, equal limits) go to plotext's code."""
    import plotext._utility as ut

    from workbench.widgets.metric_plot import install_plotext_fast_path, use_plotext_fast_path

    assert install_plotext_fast_path()
    fast = ut.get_matrix_data
    use_plotext_fast_path(False)
    original = ut.get_matrix_data
    use_plotext_fast_path(True)
    assert fast is not original
    rng = random.Random(5)
    cases = []
    for bins in (2, 3, 17, 316, 1001):
        for lo, hi in ((0.0, 1.0), (-3.5, 7.25), (1999.9, 2050.3), (1e-9, 3e-9)):
            values = [lo + (hi - lo) * rng.random() for _ in range(2_000)] + [lo, hi]
            # ties: 0.5 + (bins - 1) * t = k + (j + 0.5) * 1e-8 near cell edges k (j = -0.5: on k)
            for k in range(bins):
                for j in (-1, -0.5, 0, 1):
                    t = (k - 0.5 + (j + 0.5) * 1e-8) / (bins - 1)
                    values.append(lo + (hi - lo) * t)
            cases.append((values, [lo, hi], bins))
    cases += [
        ([1, 2, 3], [1, 3], 10),
        ([1.0, float("nan"), 2.0], [1.0, 2.0], 10),
        ([2.0, 2.0], [2.0, 2.0], 5),
    ]
    ties = 0
    for values, lim, bins in cases:
        try:
            expected = original(values, lim, bins)
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError):
                fast(values, lim, bins)
            continue
        got = fast(values, lim, bins)
        assert [str(v) for v in got] == [str(v) for v in expected], (lim, bins)
        ties += sum(
            abs((0.5 + (bins - 1) * (v - lim[0]) / (lim[1] - lim[0])) * 10**8 % 1 - 0.5) == 0 for v in values
        )
    assert ties > 0, "some values fall exactly on a rounding tie"


async def test_content_from_text_equals_textual_conversion_for_plotext_themes():
    """`content_from_text` gives Textual's own `Content.from_rich_text` result (characters and
    styled spans) for figures in plotext's themes, whose 16-colour codes go through the app's
    ANSI theme, in a dark and a light app."""
    from textual.content import Content

    from workbench.widgets.metric_plot import content_from_text, figure_text

    rng = random.Random(6)
    steps = list(range(1, 3_001))
    noisy = {f"run-{r}": downsample(steps, [r + rng.random() for _ in steps], 160) for r in range(3)}
    for app_theme in ("textual-dark", "textual-light"):
        app = PlotApp()
        app.theme = app_theme
        async with app.run_test(size=(90, 24)):
            converted = 0
            for theme in ("default", "clear", "pro", "matrix", "dark", "retro"):
                text = figure_text(_plot(noisy, 80, 16, "braille", theme))
                fast = content_from_text(text, app.console, app.ansi_theme)
                slow = Content.from_rich_text(text, console=app.console)
                assert fast.plain == slow.plain and list(fast.spans) == list(slow.spans), (app_theme, theme)
                converted += len(slow.spans)
            assert converted > 100
