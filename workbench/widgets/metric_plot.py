"""A line plot of one or more metric curves (by step), downsampled to the plot's width.

Redraws are cheap where nothing changed: each curve is downsampled once per (curve, plot width) and
each painted frame (with Textual's lines for it) is kept per (curves, size, theme), so a repaint, a
second `set_series` with the same curves, or switching back to curves already drawn runs neither
plotext nor Textual's line layout. `prepare` builds frames of other curve sets in a worker thread.
Curves are identified by the objects passed in and their length: hand over new objects (or append)
when the data change, never edit values in place.

What a first draw still costs is plotext turning the curves into braille pixels; its per-pixel
Python loops are replaced by numpy versions with byte-identical output (`install_plotext_fast_path`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual import events, work
from textual.content import Content
from textual.strip import Strip
from textual.visual import Visual
from textual.worker import Worker, get_current_worker
from textual_plotext import PlotextPlot
from textual_plotext.plot import Plot

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


def _int_array(values: Sequence):
    """`values` as an int64 array when they are all Python ints (canvas coordinates), else None."""
    import numpy as np

    if not len(values) or type(values[0]) is not int:
        return None
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        return None
    return array if array.dtype.kind == "i" and array.ndim == 1 else None


def _lines_numpy(original):
    """plotext's `get_lines` (join consecutive canvas points with straight pixel lines) in numpy.

    Same points in the same order as the pure-Python original, which it falls back to for anything
    but integer canvas coordinates. For a noisy curve this is where plotext spends its time: every
    segment becomes max(|dx|, |dy|) pixels.
    """
    import numpy as np

    def get_lines(x, y, *other):
        ax, ay = _int_array(x), _int_array(y)
        if ax is None or ay is None or len(ax) < 2 or len(ax) != len(ay):
            return original(x, y, *other)
        x0, y0 = ax[:-1], ay[:-1]
        dx, dy = np.diff(ax), np.diff(ay)
        a = np.maximum(np.abs(dx), np.abs(dy)) + 1  # points per segment, its end point included
        seg = np.repeat(np.arange(len(a)), a - 1)  # each point's segment; the end point is the next start
        i = np.arange(len(seg)) - np.repeat(np.cumsum(a - 1) - (a - 1), a - 1)  # index within segment
        steps = np.maximum(a - 1, 1)
        xl = (x0[seg] + i * (dx / steps)[seg]).astype(np.int64).tolist() + [x[-1]]
        yl = (y0[seg] + i * (dy / steps)[seg]).astype(np.int64).tolist() + [y[-1]]
        picks = seg.tolist() + [len(x) - 1]
        same = [
            bool(values) and values.count(values[0]) == len(values) for values in other
        ]  # one marker/colour a curve
        return [xl, yl] + [[v[0]] * len(picks) if c else [v[j] for j in picks] for v, c in zip(other, same)]

    return get_lines


def _hd_group_numpy(original):
    """plotext's `hd_group` (pixels -> braille cells and their dot patterns) in numpy, for braille
    pixels (2 x 4 dots a cell) with integer coordinates; anything else goes to the original."""
    import numpy as np

    # Dot pattern of a cell as plotext lists it: rows from the top (y % 4 == 3) down, two columns each.
    patterns = [tuple((bits >> k) & 1 for k in range(8)) for bits in range(256)]

    def hd_group(x, y, xf, yf):
        px, py = _int_array(x), _int_array(y)
        if px is None or py is None or len(px) != len(py) or set(xf) != {2} or set(yf) != {4}:
            return original(x, y, xf, yf)
        cx, cy = px // 2, py // 4
        key = (cx - cx.min()) * (int(cy.max() - cy.min()) + 1) + (cy - cy.min())
        _, first, cell = np.unique(key, return_index=True, return_inverse=True)
        bits = np.zeros(len(first), dtype=np.int64)
        np.bitwise_or.at(bits, cell, 1 << ((3 - py % 4) * 2 + px % 2))
        order = np.argsort(first, kind="stable")  # cells in the order their first pixel came
        keep = first[order]
        return cx[keep].tolist(), cy[keep].tolist(), [patterns[b] for b in bits[order].tolist()]

    return hd_group


def _brush_numpy(original):
    """plotext's `brush` (drop repeated (x, y, marker, colour, style) points) in numpy, for integer
    x and y with one marker, colour and style for all points (one curve). plotext returns the
    survivors in set order, so any order is as good; these come sorted."""
    import numpy as np

    def brush(*lists):
        if len(lists) < 2:
            return original(*lists)
        n = min(map(len, lists))
        px, py = _int_array(lists[0][:n]), _int_array(lists[1][:n])
        rest = [values[:n] for values in lists[2:]]
        if px is None or py is None or any(values.count(values[0]) != n for values in rest):
            return original(*lists)
        x0, y0 = int(px.min()), int(py.min())
        rows = int(py.max()) - y0 + 1
        key = np.unique((px - x0) * rows + (py - y0))
        return [(key // rows + x0).tolist(), (key % rows + y0).tolist()] + [[v[0]] * len(key) for v in rest]

    return brush


FAST_PATH = {"get_lines": _lines_numpy, "brush": _brush_numpy, "hd_group": _hd_group_numpy}


def install_plotext_fast_path() -> bool:
    """Swap plotext's per-pixel loops (`get_lines`, `brush`, `hd_group`) for the numpy versions above.

    The figures are unchanged (tests compare whole plots built both ways); a noisy 50,000-step curve
    builds several times faster. Idempotent; returns False when plotext lacks the functions.
    """
    import plotext._utility as ut

    if hasattr(ut, "tunebench_originals"):
        return True
    if not all(callable(getattr(ut, name, None)) for name in FAST_PATH):
        return False
    ut.tunebench_originals = {name: getattr(ut, name) for name in FAST_PATH}  # kept for the tests
    for name, make in FAST_PATH.items():
        setattr(ut, name, make(getattr(ut, name)))
    return True


def build_figure(
    plt: Plot,
    series: dict[str, Curve],
    title: str,
    size: tuple[int, int],
    theme_name: str,
    downsampled=downsample,
) -> Text:
    """Draw `series` into the plotext figure `plt` at `size` (columns, rows) and return it as Rich
    text. Each curve is `downsampled(xs, ys, budget)` first: one bucket (its minimum and maximum) per
    column, since braille draws two sub-columns per cell and more points cost plotext time without
    showing more. Curves without points are skipped; none at all reads "<title>: no data yet"."""
    width, height = size
    plt.clear_data()
    plt.clear_figure()
    plt.title("")
    budget = 2 * max(10, width or 80)
    drawn = False
    for label, (xs, ys) in series.items():
        px, py = downsampled(xs, ys, budget)
        if px:
            plt.plot(px, py, label=label if len(series) > 1 else None, marker="braille")
            drawn = True
    if not drawn:
        plt.title(f"{title}: no data yet")
    plt.plotsize(width, height)
    plt._set_size(width, height)  # as textual-plotext does: plotsize alone does not always resize
    plt.theme(theme_name)
    return Text.from_ansi(plt.build())


def _identity(series: dict[str, Curve]) -> tuple:
    """What identifies a set of curves for the caches: labels, the objects and their lengths."""
    return tuple((label, id(xs), id(ys), len(xs), len(ys)) for label, (xs, ys) in series.items())


class MetricPlot(PlotextPlot):
    """Curves `{label: (steps, values)}` drawn together; `set_series` replaces them and redraws.

    `prepare` builds the frames of other curve sets (Compare's other metrics) in a worker thread,
    so that showing one of them later is a cache hit. `builds` counts the frames built on the event
    loop, `prepared` those built by the worker.
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
        install_plotext_fast_path()
        self.title = title
        self.y_label = y_label
        self.border_title = title
        self.border_subtitle = "by step"
        self.builds = 0
        self.prepared = 0
        self._series: dict[str, Curve] = {}
        self._identity: tuple = ()
        self._alternatives: list[dict[str, Curve]] = []
        # Both caches keep the source objects in their values, so the ids in their keys stay unique.
        self._curves: OrderedDict[tuple, tuple[Curve, tuple[list[float], list[float]]]] = OrderedDict()
        # frame key -> [curves, Content, the visual style its lines were made with, the lines]
        self._frames: OrderedDict[tuple, list] = OrderedDict()

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

    def prepare(self, alternatives: list[dict[str, Curve]]) -> Worker | None:
        """Build the frames of these curve sets in a worker thread at the current size (and again
        after each resize), so that `set_series` with one of them costs a cache hit. Replaces the
        previous list; frames already cached are skipped. Returns the worker (None before the plot
        has a size or without curve sets)."""
        self._alternatives = [dict(series) for series in alternatives]
        width, height = self.size
        if self._alternatives and width and height:
            return self._prepare(self._alternatives, (width, height), self.theme, self.app.theme)
        return None

    def on_resize(self, event: events.Resize) -> None:
        if self._alternatives:
            self.prepare(self._alternatives)

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

    def _key(self, series: dict[str, Curve], size: tuple[int, int], theme: str, app_theme: str) -> tuple:
        return (_identity(series), self.title, *size, theme, app_theme)

    def _keep(self, key: tuple, series: dict[str, Curve], text: Text) -> Content:
        frame = Content.from_rich_text(text, console=self.app.console)
        self._frames[key] = [series, frame, None, None]
        while len(self._frames) > self.FRAMES_KEPT:
            self._frames.popitem(last=False)
        return frame

    @work(thread=True, exclusive=True, group="metric-plot-prepare", exit_on_error=False)
    def _prepare(self, alternatives: list, size: tuple[int, int], theme: str, app_theme: str) -> None:
        worker, plt = get_current_worker(), Plot()  # its own figure: the widget's stays on the loop
        theme_name = self._get_plotext_theme_name(app_theme)
        for series in alternatives:
            key = self._key(series, size, theme, app_theme)
            if worker.is_cancelled:
                return
            if key in self._frames:
                continue
            text = build_figure(plt, series, self.title, size, theme_name)
            if worker.is_cancelled:  # screen closed meanwhile (or the app is quitting)
                return
            try:
                self.app.call_from_thread(self._add_prepared, key, series, text)
            except RuntimeError:  # the app stopped while this frame was built
                return

    def _add_prepared(self, key: tuple, series: dict[str, Curve], text: Text) -> None:
        if key not in self._frames:
            self._keep(key, series, text)
            self.prepared += 1

    def render(self) -> Any:
        """The frame for the current curves, size and theme: from the cache, else built by plotext."""
        size = (self.size.width, self.size.height)
        key = self._key(self._series, size, self.theme, self.app.theme)
        hit = self._frames.get(key)
        if hit is not None:
            self._frames.move_to_end(key)
            return hit[1]
        theme_name = self._get_plotext_theme_name(self.app.theme)
        text = build_figure(self.plt, self._series, self.title, size, theme_name, self._downsampled)
        self.builds += 1
        return self._keep(key, self._series, text)

    def render_line(self, y: int) -> Strip:
        """Line `y` of the frame; the frame's lines are kept with it, so a repaint of curves already
        drawn skips both plotext and Textual's line layout."""
        width, height = self.size
        frame = self.render()
        entry = self._frames[self._key(self._series, (width, height), self.theme, self.app.theme)]
        style = self.visual_style
        if entry[2] != style:
            entry[2], entry[3] = style, Visual.to_strips(self, frame, width, height, style)
        strips = entry[3]
        return strips[y] if y < len(strips) else Strip.blank(width, style.rich_style)
