"""A line plot of one or more metric curves (by step), downsampled to the plot's width.

Redraws are cheap where nothing changed: each curve is downsampled once per (curve, plot width) and
each painted frame is kept per (curves, size, theme), so a repaint, a second `set_series` with the same
curves, or switching back to curves already drawn never runs plotext again. Curves are identified by
the objects passed in and their length: hand over new objects (or append) when the data change, never
edit values in place.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from textual.content import Content
from textual.strip import Strip
from textual.visual import Visual
from textual_plotext import PlotextPlot

Curve = tuple[Sequence[float], Sequence[float]]


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    """Reduce a curve to at most about `max_points` points keeping each bucket's minimum and maximum.

    A loss spike or dip survives downsampling (a plain stride would drop it); the first and last
    points are always kept. Non-finite values are skipped. `xs` must be sorted; lists or numpy
    arrays. Returns new lists (numpy does the work, so 50,000 points take about a millisecond).
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


def _identity(series: dict[str, Curve]) -> tuple:
    """What identifies a set of curves for the caches: labels, the objects and their lengths."""
    return tuple((label, id(xs), id(ys), len(xs), len(ys)) for label, (xs, ys) in series.items())


class MetricPlot(PlotextPlot):
    """Curves `{label: (steps, values)}` drawn together; `set_series` replaces them and redraws.

    `builds` counts the frames plotext has built (a repaint from the cache does not add one).
    """

    DEFAULT_CSS = """
    MetricPlot {
        height: 1fr;
        min-height: 6;
        border: round $panel;
    }
    """
    FRAMES_KEPT = 8  # painted frames kept (Compare cycles through 5 metrics; Live adds one per poll)
    CURVES_KEPT = 64  # downsampled curves kept

    def __init__(self, title: str, *, y_label: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.y_label = y_label
        self.border_title = title
        self.border_subtitle = "by step"
        self.builds = 0
        self._series: dict[str, Curve] = {}
        self._identity: tuple = ()
        # Both caches keep the source objects in their values, so the ids in their keys stay unique.
        self._curves: OrderedDict[tuple, tuple[Curve, tuple[list[float], list[float]]]] = OrderedDict()
        self._frames: OrderedDict[tuple, tuple[dict[str, Curve], Content]] = OrderedDict()

    @property
    def series(self) -> dict[str, Curve]:
        return self._series

    def set_series(self, series: dict[str, Curve]) -> None:
        """Replace the curves (label -> (steps, values)); repaint only when they differ from the
        current ones (other objects, other lengths or other labels)."""
        series = dict(series)
        identity = _identity(series)
        if identity == self._identity:  # taken when last set: lists that grew since differ
            return
        self._series, self._identity = series, identity
        self.refresh()

    def forget(self) -> None:
        """Drop the cached frames and downsampled curves and repaint (the next frame is built cold)."""
        self._frames.clear()
        self._curves.clear()
        self.refresh()

    def _downsampled(self, xs: Sequence[float], ys: Sequence[float], budget: int) -> tuple[list, list]:
        key = (id(xs), id(ys), len(xs), len(ys), budget)
        hit = self._curves.get(key)
        if hit is None:
            hit = self._curves[key] = ((xs, ys), downsample(xs, ys, budget))
            while len(self._curves) > self.CURVES_KEPT:
                self._curves.popitem(last=False)
        else:
            self._curves.move_to_end(key)
        return hit[1]

    def _draw(self, width: int) -> None:
        """Put the current curves, downsampled for `width` columns, into a cleared plotext figure."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("")
        # One bucket (its minimum and maximum) per terminal column: braille draws two sub-columns per
        # cell, so the two points fill them; more points cost plotext time without showing more.
        budget = max(8, 2 * width)
        drawn = False
        for label, (xs, ys) in self._series.items():
            px, py = self._downsampled(xs, ys, budget)
            if px:
                plt.plot(px, py, label=label if len(self._series) > 1 else None, marker="braille")
                drawn = True
        if not drawn:
            plt.title(f"{self.title}: no data yet")

    def _frame_key(self) -> tuple:
        width, height = self.size
        return (_identity(self._series), self.title, width, height, self.theme, self.app.theme)

    def render(self) -> Any:
        """The frame for the current curves, size and theme: from the cache, else built by plotext."""
        key = self._frame_key()
        hit = self._frames.get(key)
        if hit is not None:
            self._frames.move_to_end(key)
            return hit[1]
        self._draw(max(10, self.size.width or 80))
        frame = Content.from_rich_text(super().render(), console=self.app.console)
        self.builds += 1
        self._frames[key] = [self._series, frame, None, None]
        while len(self._frames) > self.FRAMES_KEPT:
            self._frames.popitem(last=False)
        return frame

    def render_line(self, y: int) -> Strip:
        """Line `y` of the frame; the frame's lines are kept with it, so a repaint of curves already
        drawn skips both plotext and Textual's line layout (the dearest part for noisy curves)."""
        width, height = self.size
        frame = self.render()
        entry = self._frames[self._frame_key()]
        style = self.visual_style
        if entry[2] != style:
            entry[2], entry[3] = style, Visual.to_strips(self, frame, width, height, style)
        strips = entry[3]
        return strips[y] if y < len(strips) else Strip.blank(width, style.rich_style)
