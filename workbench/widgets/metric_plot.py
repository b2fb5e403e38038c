"""A line plot of one or more metric curves (by step), downsampled to the plot's width."""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual_plotext import PlotextPlot


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    """Reduce a curve to at most `max_points` points keeping each bucket's minimum and maximum.

    A loss spike or a NaN-free dip survives downsampling (a plain stride would drop it). Non-finite
    values are skipped. `xs` must be sorted. Returns new lists; inputs are not modified.
    """
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    if len(pairs) <= max_points or max_points < 4:
        return [p[0] for p in pairs], [p[1] for p in pairs]
    buckets = max_points // 2
    size = len(pairs) / buckets
    out_x: list[float] = []
    out_y: list[float] = []
    for b in range(buckets):
        chunk = pairs[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        for x, y in sorted((lo, hi)) if lo is not hi else (lo,):
            out_x.append(x)
            out_y.append(y)
    return out_x, out_y


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
        self._series: dict[str, tuple[Sequence[float], Sequence[float]]] = {}
        self._cache: dict[str, tuple[list[float], list[float]]] = {}
        self._cache_width = -1

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
        budget = max(8, 2 * width)
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
        plt.xlabel("step")
        self.refresh()
