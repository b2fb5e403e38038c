"""A line plot of one or more metric curves (by step), downsampled to the plot's width.

The figure is ours: `workbench.widgets.braille` rasterises the curves with numpy onto a braille
canvas and lays out axes, ticks and a legend as plain text with colour roles; this widget picks the
colours from the app's theme and turns the frame into Textual content.

Redraws are cheap where nothing changed: each curve is downsampled once per (curve, plot width) and
each painted frame (with Textual's lines for it) is kept per (curves, size, theme), so a repaint, a
second `set_series` with the same curves, or switching back to curves already drawn runs neither the
renderer nor Textual's line layout. `prepare` builds frames of other curve sets in a worker thread,
which posts each one back as a `FramePrepared` message.
Curves are identified by the objects passed in and their length: hand over new objects (or append)
when the data change, never edit values in place.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from textual import events, work
from textual.color import Color
from textual.content import Content, Span
from textual.strip import Strip
from textual.style import Style
from textual.visual import Visual
from textual.widget import Widget
from textual.worker import Worker, get_current_worker

from workbench.ui_messages import FramePrepared
from workbench.widgets.braille import AXIS, LABEL, Frame, render_plot

Curve = tuple[Sequence[float], Sequence[float]]
# theme colours for curves 0, 1, ... (repeated colours skipped, then the list cycles)
CURVE_COLOURS = ("primary", "success", "accent", "error", "warning", "secondary", "foreground")


def _downsample(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """`downsample` as float64 arrays."""
    n = min(len(xs), len(ys))  # a curve read while it grows may have one more step than values
    x = np.asarray(xs[:n], dtype=np.float64)
    y = np.asarray(ys[:n], dtype=np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    if not finite.all():
        x, y = x[finite], y[finite]
    n = len(y)
    if n <= max_points or max_points < 4:
        return x, y
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
    return x[picks], y[picks]


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    """Reduce a curve to at most about `max_points` points keeping each bucket's minimum and maximum.

    A loss spike or dip survives downsampling (a plain stride would drop it); the first and last
    points are always kept. Non-finite points are skipped, and points past the shorter of `xs` and
    `ys`. `xs` must be sorted; lists or numpy arrays. Returns new lists (numpy does the work, so 50,000 points take about a millisecond).
    """
    x, y = _downsample(xs, ys, max_points)
    return x.tolist(), y.tolist()


def point_budget(width: int) -> int:
    """Points kept per curve in a plot `width` cells wide: a minimum and a maximum per braille
    pixel column (two a cell), so a noisy curve's band and its spikes are drawn as they are."""
    return 4 * max(10, width)


def palette(variables: dict[str, str]) -> dict[int, Style]:
    """Styles of a frame's roles (see `braille.Frame`) from an app's theme variables: curve k gets
    the k-th distinct colour of `CURVE_COLOURS` (cycling), axes and tick labels the muted text colour."""
    background = Color.parse(variables.get("background", "#000000"))

    def opaque(value: str) -> Color:  # a translucent colour blended over the background (ANSI ones kept)
        name, _, alpha = value.partition(" ")  # "ansi_default 50%": a colour and its opacity
        colour = Color.parse(name)
        if alpha.endswith("%") and colour.ansi is None:
            colour = colour.with_alpha(colour.a * float(alpha[:-1]) / 100)
        return colour if colour.a == 1 else background + colour

    colours: list[Color] = []
    for name in CURVE_COLOURS:
        if variables.get(name) and opaque(variables[name]) not in colours:
            colours.append(opaque(variables[name]))
    muted = opaque(variables.get("foreground-muted") or variables.get("foreground", "#888888"))
    styles = {AXIS: Style(foreground=muted), LABEL: Style(foreground=muted)}
    styles.update({k: Style(foreground=colour) for k, colour in enumerate(colours)})
    return styles


def frame_content(frame: Frame, styles: dict[int, Style]) -> Content:
    """The frame as Textual content: its lines, one span per coloured run (curves past the palette's
    length reuse its colours in turn)."""
    curves = [k for k in styles if k >= 0]
    spans = []
    offset = 0
    for line, runs in zip(frame.lines, frame.spans):
        for start, end, role in runs:
            style = styles[role] if role < 0 else styles[curves[role % len(curves)]]
            spans.append(Span(offset + start, offset + end, style))
        offset += len(line) + 1
    return Content("\n".join(frame.lines), spans)


def build_frame(
    series: dict[str, Curve],
    title: str,
    size: tuple[int, int],
    styles: dict[int, Style],
    downsampled=_downsample,
) -> Content:
    """`series` drawn at `size` (columns, rows) as content in the colours `styles`. Each curve is
    `downsampled(xs, ys, point_budget(width))` first. Curves without points are skipped; none at all
    reads "<title>: no data yet"."""
    width, height = size
    budget = point_budget(width)
    curves = [downsampled(xs, ys, budget) for xs, ys in series.values()]
    labels = list(series) if len(series) > 1 else [""] * len(series)
    frame = render_plot(curves, labels, width, height, note=f"{title}: no data yet")
    return frame_content(frame, styles)


def _identity(series: dict[str, Curve]) -> tuple:
    """What identifies a set of curves for the caches: labels, the objects and their lengths."""
    return tuple((label, id(xs), id(ys), len(xs), len(ys)) for label, (xs, ys) in series.items())


class MetricPlot(Widget):
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
        self._curves: OrderedDict[tuple, tuple[Curve, tuple[np.ndarray, np.ndarray]]] = OrderedDict()
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
            keys = [self._key(series, (width, height)) for series in self._alternatives]
            todo = [(key, series) for key, series in zip(keys, self._alternatives) if key not in self._frames]
            return self._prepare(todo, self.title, (width, height), self._styles())
        return None

    def on_resize(self, event: events.Resize) -> None:
        if self._alternatives:
            self.prepare(self._alternatives)

    def forget(self) -> None:
        """Drop the cached frames and downsampled curves and repaint (the next frame is built cold)."""
        self._frames.clear()
        self._curves.clear()
        self.refresh()

    def _styles(self) -> dict[int, Style]:
        return palette(self.app.theme_variables)

    def _downsampled(self, xs: Sequence[float], ys: Sequence[float], budget: int) -> tuple:
        key = (id(xs), id(ys), len(xs), len(ys), budget)
        hit = self._curves.get(key)
        if hit is None:
            hit = self._curves[key] = ((xs, ys), _downsample(xs, ys, budget))
            while len(self._curves) > self.CURVES_KEPT:
                self._curves.popitem(last=False)
        else:
            self._curves.move_to_end(key)
        return hit[1]

    def _key(self, series: dict[str, Curve], size: tuple[int, int]) -> tuple:
        return (_identity(series), self.title, *size, self.app.theme)

    def _keep(self, key: tuple, series: dict[str, Curve], frame: Content) -> Content:
        self._frames[key] = [series, frame, None, None]
        while len(self._frames) > self.FRAMES_KEPT:
            self._frames.popitem(last=False)
        return frame

    @work(thread=True, exclusive=True, group="metric-plot-prepare", exit_on_error=False)
    def _prepare(self, todo: list, title: str, size: tuple[int, int], styles: dict[int, Style]) -> None:
        """Build the frames of `todo` ((key, curves) pairs) off the event loop; each one is posted to
        the plot as a `FramePrepared` message as it is done. Takes everything it reads as arguments."""
        worker = get_current_worker()
        for key, series in todo:
            if worker.is_cancelled:
                return
            frame = build_frame(series, title, size, styles)
            if worker.is_cancelled:  # screen closed meanwhile (or the app is quitting)
                return
            try:
                self.post_message(FramePrepared(key, series, frame))
            except RuntimeError:  # the app's loop stopped while this frame was built
                return

    def on_frame_prepared(self, message: FramePrepared) -> None:
        message.stop()
        if message.key not in self._frames:
            self._keep(message.key, message.series, message.frame)
            self.prepared += 1

    def render(self) -> Content:
        """The frame for the current curves, size and theme: from the cache, else drawn."""
        size = (self.size.width, self.size.height)
        key = self._key(self._series, size)
        hit = self._frames.get(key)
        if hit is not None:
            self._frames.move_to_end(key)
            return hit[1]
        frame = build_frame(self._series, self.title, size, self._styles(), self._downsampled)
        self.builds += 1
        return self._keep(key, self._series, frame)

    def render_line(self, y: int) -> Strip:
        """Line `y` of the frame; the frame's lines are kept with it, so a repaint of curves already
        drawn skips both the renderer and Textual's line layout."""
        width, height = self.size
        frame = self.render()
        entry = self._frames[self._key(self._series, (width, height))]
        style = self.visual_style
        if entry[2] != style:
            entry[2], entry[3] = style, Visual.to_strips(self, frame, width, height, style)
        strips: Any = entry[3]
        return strips[y] if y < len(strips) else Strip.blank(width, style.rich_style)
