"""A line plot of one or more metric curves (by step), downsampled to the plot's width."""

from __future__ import annotations

from collections.abc import Sequence

from textual_plotext import PlotextPlot


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    """Reduce a curve to at most about `max_points` points keeping each bucket's minimum and maximum.

    A loss spike or dip survives downsampling (a plain stride would drop it). Non-finite values are
    skipped. `xs` must be sorted; lists or numpy arrays. Returns new lists (numpy does the work, so
    50,000 points take about a millisecond).
    """
    import numpy as np

    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    finite = np.isfinite(y)
    if not finite.all():
        x, y = x[finite], y[finite]
    n = len(y)
    if n <= max_points or max_points < 4:
        return x.tolist(), y.tolist()
    buckets = max_points // 2
    k = n // buckets  # points per bucket; the last n - buckets * k points form one more bucket
    body = y[: buckets * k].reshape(buckets, k)
    offsets = np.arange(buckets) * k
    picks = np.sort(np.stack([body.argmin(1) + offsets, body.argmax(1) + offsets], axis=1), axis=1).ravel()
    tail = y[buckets * k :]
    if len(tail):
        start = buckets * k
        picks = np.concatenate([picks, np.sort([start + int(tail.argmin()), start + int(tail.argmax())])])
    picks = np.unique(np.concatenate([[0], picks, [n - 1]]))  # first and last points always drawn
    return x[picks].tolist(), y[picks].tolist()


class MetricPlot(PlotextPlot):
    """Curves `{label: (steps, values)}` drawn together; `set_series` replaces them and redraws.

    The downsampled copy is cached per plot width so a redraw with unchanged data costs only the
    plotext build.
    """

    DEFAULT_CSS = """
    MetricPlot {
        height: 1fr;
        min-height: 6;
        border: round $panel;
    }
    """

    def __init__(self, title: str, *, y_label: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.y_label = y_label
        self.border_title = title
        self.border_subtitle = "by step"
        self._series: dict[str, tuple[Sequence[float], Sequence[float]]] = {}
        self._cache: dict[str, tuple[list[float], list[float]]] = {}
        self._cache_width = -1

    def on_mount(self) -> None:
        super().on_mount()
        self.replot()  # "no data yet" until the first points arrive

    @property
    def series(self) -> dict[str, tuple[Sequence[float], Sequence[float]]]:
        return self._series

    def set_series(self, series: dict[str, tuple[Sequence[float], Sequence[float]]]) -> None:
        """Replace the curves (label -> (steps, values)) and schedule a redraw."""
        self._series = dict(series)
        self._cache.clear()
        self.replot()

    def _points(self, width: int) -> dict[str, tuple[list[float], list[float]]]:
        if width != self._cache_width:
            self._cache.clear()
            self._cache_width = width
        # One point per terminal column: braille draws two sub-columns per cell and joins the points
        # with lines, so more points cost plotext time without showing more.
        budget = max(8, width)
        for label, (xs, ys) in self._series.items():
            if label not in self._cache:
                self._cache[label] = downsample(xs, ys, budget)
        return self._cache

    def replot(self) -> None:
        """Rebuild the plotext figure from the current series (downsampled) and refresh."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("")
        points = self._points(max(10, self.size.width or 80))
        drawn = False
        for label, (xs, ys) in points.items():
            if xs:
                plt.plot(xs, ys, label=label if len(points) > 1 else None, marker="braille")
                drawn = True
        if not drawn:
            plt.title(f"{self.title}: no data yet")
        self.refresh()
