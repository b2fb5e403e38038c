"""A line plot of one or more metric curves (by step), downsampled to the plot's width.

Redraws are cheap where nothing changed: each curve is downsampled once per (curve, plot width) and
each painted frame (with Textual's lines for it) is kept per (curves, size, theme), so a repaint, a
second `set_series` with the same curves, or switching back to curves already drawn runs neither
plotext nor Textual's line layout. `prepare` builds frames of other curve sets in a worker thread.
Curves are identified by the objects passed in and their length: hand over new objects (or append)
when the data change, never edit values in place.

A first draw is plotext turning the curves into braille pixels and cells: its per-pixel and
per-cell loops (line joining, de-duplication, braille grouping, clipping, data to canvas
coordinates, matrix insertion) are replaced by numpy or leaner versions with byte-identical output
(`install_plotext_fast_path`; pixel lists travel with their numpy arrays, so no step converts them
back), and the figure becomes Rich text straight from plotext's character and colour matrices
(`figure_text`) instead of printing ANSI codes and parsing them back. What remains per pixel is
plotext's own `build_plot` code (a marker-size lookup per pixel, an insertion per cell).
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


class _Pixels(list):
    """Canvas coordinates as plotext wants them (a list of Python ints) that also carry the same
    values as an int64 numpy `array`, a `token` shared with the list of the other coordinate made
    with it, and whether the (x, y) pairs of the two are `distinct`. The next numpy step then skips
    converting the list back (and de-duplicating pairs known distinct); plotext's own code just
    sees a list."""

    __slots__ = ("array", "token", "distinct")


def _pixels(ax, ay, distinct: bool) -> tuple[_Pixels, _Pixels]:
    """(x, y) int64 arrays as a pair of `_Pixels` lists."""
    token = object()
    pair = []
    for array in (ax, ay):
        values = _Pixels(array.tolist())
        values.array, values.token, values.distinct = array, token, distinct
        pair.append(values)
    return pair[0], pair[1]


def _array_of(values: Sequence):
    """`values` as an int64 array: the one a `_Pixels` list carries, else converted (None when they
    are not all Python ints)."""
    if type(values) is _Pixels and len(values) == len(values.array):
        return values.array
    return _int_array(values)


def _arrays(x: Sequence, y: Sequence):
    """(x as int64 array, y as int64 array, pairs known distinct) for integer canvas coordinates of
    equal length, else None. `_Pixels` lists hand over their arrays without converting."""
    ax, ay = _array_of(x), _array_of(y)
    if ax is None or ay is None or len(ax) != len(ay):
        return None
    distinct = type(x) is _Pixels and type(y) is _Pixels and x.token is y.token and x.distinct
    return ax, ay, distinct


def _matrix_data_numpy(original):
    """plotext's `get_matrix_data` (data values -> canvas coordinates, `floor(round(0.5 + (bins - 1)
    * (v - lo) / (hi - lo), 8))`) in numpy with the same float operations in the same order, for
    Python floats and float limits (all finite); anything else goes to the original."""
    import numpy as np

    def get_matrix_data(data, lim, bins):
        if (
            type(bins) is not int
            or len(lim) != 2
            or type(lim[0]) is not float
            or type(lim[1]) is not float
            or lim[0] == lim[1]
            or not len(data)
            or not all(type(v) is float for v in data)
        ):
            return original(data, lim, bins)
        values = np.asarray(data, dtype=np.float64)
        if not np.isfinite(values).all():
            return original(data, lim, bins)
        n = (0.5 + (bins - 1) * (values - lim[0]) / (lim[1] - lim[0])) * 10**8  # plotext's round(n, 8)
        f = np.floor(n)
        rounded = np.where(n - f < 0.5, f, np.ceil(n)) * 10 ** (-8)
        # a plain list: plotext also maps tick and line positions here and flattens those with a
        # `type(row) == list` test that a list subclass fails
        return np.floor(rounded).astype(np.int64).tolist()

    return get_matrix_data


def _uniform(values: Sequence) -> bool:
    """Whether `values` (a curve's markers, colours or styles, one a point) are all one value."""
    return bool(values) and values.count(values[0]) == len(values)


BITMAP_LIMIT = 1 << 22  # de-duplicate on a bitmap up to this many canvas pixels, else by sorting


def _distinct_pairs(ax, ay):
    """The distinct (x, y) pairs of two int64 arrays, sorted by x then y."""
    import numpy as np

    x0, y0 = int(ax.min()), int(ay.min())
    rows = int(ay.max()) - y0 + 1
    key = (ax - x0) * rows + (ay - y0)
    size = (int(ax.max()) - x0 + 1) * rows
    if size <= BITMAP_LIMIT:  # a plot's canvas: mark the pixels, read them back in order
        seen = np.zeros(size, dtype=bool)
        seen[key] = True
        key = np.flatnonzero(seen)
    else:
        key = np.unique(key)
    return key // rows + x0, key % rows + y0


def _lines_numpy(original):
    """plotext's `get_lines` (join consecutive canvas points with straight pixel lines) in numpy.

    The same pixels as the pure-Python original, which it falls back to for anything but integer
    canvas coordinates. For one curve (one marker, colour and style for all its points) each pixel
    comes once, sorted: repeats draw nothing (the next steps, `fill_data` and `brush`, drop them)
    and plotext itself forgets their order in `brush` (a set). Several markers or colours along a
    curve keep the original's points and order. For a noisy curve this is where plotext spends its
    time: every segment becomes max(|dx|, |dy|) pixels.
    """
    import numpy as np

    def get_lines(x, y, *other):
        pair = _arrays(x, y)
        if pair is None or len(x) < 2 or any(len(values) != len(x) for values in other):
            return original(x, y, *other)
        ax, ay, _ = pair
        x0, y0 = ax[:-1], ay[:-1]
        dx, dy = np.diff(ax), np.diff(ay)
        a = np.maximum(np.abs(dx), np.abs(dy)) + 1  # points per segment, its end point included
        seg = np.repeat(np.arange(len(a)), a - 1)  # each point's segment; the end point is the next start
        i = np.arange(len(seg)) - np.repeat(np.cumsum(a - 1) - (a - 1), a - 1)  # index within segment
        steps = np.maximum(a - 1, 1)
        xl = np.append((x0[seg] + i * (dx / steps)[seg]).astype(np.int64), ax[-1])
        yl = np.append((y0[seg] + i * (dy / steps)[seg]).astype(np.int64), ay[-1])
        if other and all(map(_uniform, other)):  # one curve: each pixel once
            px, py = _pixels(*_distinct_pairs(xl, yl), distinct=True)
            return [px, py] + [[values[0]] * len(px) for values in other]
        picks = seg.tolist() + [len(x) - 1]
        return [xl.tolist(), yl.tolist()] + [[values[j] for j in picks] for values in other]

    return get_lines


def _hd_group_numpy(original):
    """plotext's `hd_group` (pixels -> braille cells and their dot patterns) in numpy, for braille
    pixels (2 x 4 dots a cell) with integer coordinates; anything else goes to the original.
    The cells come sorted by x then y, each once (the original lists them in the order of their
    first pixel; plotext draws each distinct cell once, so the order changes nothing drawn)."""
    import numpy as np

    # Dot pattern of a cell as plotext lists it: rows from the top (y % 4 == 3) down, two columns each.
    patterns = [tuple((bits >> k) & 1 for k in range(8)) for bits in range(256)]

    def hd_group(x, y, xf, yf):
        pair = _arrays(x, y)
        if pair is None or not len(x) or type(xf) is not list or type(yf) is not list or not xf:
            return original(x, y, xf, yf)
        if xf.count(2) != len(xf) or yf.count(4) != len(yf):  # braille: 2 x 4 dots, all points
            return original(x, y, xf, yf)
        px, py, distinct = pair
        if not distinct:  # a pixel given twice would add its dot twice below
            px, py = _distinct_pairs(px, py)
        cx, cy = px // 2, py // 4
        x0, y0 = int(cx.min()), int(cy.min())
        rows = int(cy.max()) - y0 + 1
        key = (cx - x0) * rows + (cy - y0)
        dot = 1 << ((3 - py % 4) * 2 + px % 2)  # each distinct pixel of a cell is a distinct dot
        if (int(cx.max()) - x0 + 1) * rows <= BITMAP_LIMIT:
            bits = np.bincount(key, weights=dot).astype(np.int64)  # sum of distinct dots = their OR
            cells = np.flatnonzero(bits)
            bits = bits[cells]
        else:
            cells, where = np.unique(key, return_inverse=True)
            bits = np.bincount(where, weights=dot).astype(np.int64)
        gx, gy = _pixels(cells // rows + x0, cells % rows + y0, distinct=True)
        return gx, gy, [patterns[b] for b in bits.tolist()]

    return hd_group


def _brush_numpy(original):
    """plotext's `brush` (drop repeated (x, y, marker, colour, style) points) in numpy, for integer
    x and y. Pairs already known distinct (from the functions above) come back as they are, whatever
    their markers; otherwise one marker, colour and style for all points (one curve) is needed.
    plotext returns the survivors in set order, so any order is as good; these come sorted."""

    def brush(*lists):
        if len(lists) < 2:
            return original(*lists)
        n = min(map(len, lists))
        pair = _arrays(lists[0], lists[1])
        if pair is None or n != len(lists[0]):
            return original(*lists)
        ax, ay, distinct = pair
        rest = [values[:n] for values in lists[2:]]
        if distinct:
            return [lists[0], lists[1]] + rest
        if not n or not all(map(_uniform, rest)):
            return original(*lists)
        px, py = _pixels(*_distinct_pairs(ax, ay), distinct=True)
        return [px, py] + [[values[0]] * len(px) for values in rest]

    return brush


def _outsiders_numpy(original):
    """plotext's `remove_outsiders` (keep the points inside a width x height canvas) in numpy, for
    integer coordinates and an integer canvas size; anything else goes to the original."""
    import numpy as np

    def remove_outsiders(x, y, width, height, *other):
        pair = _arrays(x, y)
        n = len(x)
        if (
            pair is None
            or not n
            or type(width) is not int
            or type(height) is not int
            or any(len(values) < n for values in other)
        ):
            return original(x, y, width, height, *other)
        ax, ay, distinct = pair
        inside = (ax >= 0) & (ax < width) & (ay >= 0) & (ay < height)
        if inside.all():
            return [x, y] + [list(values[:n]) for values in other]
        keep = np.flatnonzero(inside)
        if not len(keep):
            return original(x, y, width, height, *other)
        px, py = _pixels(ax[keep], ay[keep], distinct)
        picks = keep.tolist()
        return [px, py] + [[values[i] for i in picks] for values in other]

    return remove_outsiders


def _hd_marker_cached(original):
    """plotext's `get_hd_marker` (dot pattern -> braille character) behind a C-level cache; the
    original memoizes in Python, which costs more per call than the lookup itself."""
    import functools

    return functools.lru_cache(maxsize=None)(original)


def _insert_element_lean(original):
    """plotext's `matrix_class.insert_element` (put one character with its colours into the figure)
    without its per-call helper methods, for integer positions outside the canvas check; anything
    else goes to the original. Same effect: out of the matrix nothing happens, `None` colours and
    styles leave the cell's as they are."""

    def insert_element(
        self, col, row, marker, fullground=None, style=None, background=None, check_canvas=False
    ):
        if check_canvas is not False or type(col) is not int or type(row) is not int:
            return original(self, col, row, marker, fullground, style, background, check_canvas)
        if 0 <= col < self.cols and 0 <= row < self.rows:
            self.marker[row][col] = marker
            if fullground is not None:
                self.fullground[row][col] = fullground
            if background is not None:
                self.background[row][col] = background
            if style is not None:
                self.style[row][col] = style
        return None

    return insert_element


# plotext functions (in plotext._utility) and methods (of plotext._matrix.matrix_class) swapped
FAST_PATH = {
    "get_lines": _lines_numpy,
    "brush": _brush_numpy,
    "hd_group": _hd_group_numpy,
    "remove_outsiders": _outsiders_numpy,
    "get_hd_marker": _hd_marker_cached,
    "get_matrix_data": _matrix_data_numpy,
}
FAST_MATRIX = {"insert_element": _insert_element_lean}


def _fast_path_slots() -> list[tuple[Any, str, Any]]:
    """(owner, name, fast version maker) of everything the fast path swaps."""
    import plotext._matrix as mx
    import plotext._utility as ut

    return [(ut, name, make) for name, make in FAST_PATH.items()] + [
        (mx.matrix_class, name, make) for name, make in FAST_MATRIX.items()
    ]


_SWAPPED: dict[tuple[Any, str], tuple[Any, Any]] = {}  # (owner, name) -> (original, fast version)


def install_plotext_fast_path() -> bool:
    """Swap plotext's per-pixel and per-cell loops for the versions above (numpy where it counts).

    The figures are unchanged (tests compare whole plots built both ways); a noisy 50,000-step curve
    builds several times faster. Idempotent; returns False (and swaps nothing) when plotext lacks
    one of the functions.
    """
    slots = _fast_path_slots()
    if not _SWAPPED:
        if not all(callable(getattr(owner, name, None)) for owner, name, _ in slots):
            return False
        for owner, name, make in slots:
            original = getattr(owner, name)
            original = getattr(original, "tunebench_original", original)  # swapped by an earlier import
            fast = make(original)
            fast.tunebench_original = original
            _SWAPPED[(owner, name)] = (original, fast)
    use_plotext_fast_path(True)
    return True


def use_plotext_fast_path(enabled: bool) -> None:
    """Put the fast versions (True) or plotext's originals (False) in place; after
    `install_plotext_fast_path`. For tests that draw a figure both ways."""
    for (owner, name), (original, fast) in _SWAPPED.items():
        setattr(owner, name, fast if enabled else original)


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
    return figure_text(plt)


def figure_text(plt: Plot) -> Text:
    """Build the plotext figure `plt` and return what `Text.from_ansi(plt.build())` returns, read
    straight from the figure's character and colour matrices instead of writing them out as ANSI
    codes and parsing those back: one span per run of cells with the same colours (as plotext
    writes them), the colours of each distinct run parsed by Rich once. Falls back to that
    round trip for what this does not cover (plotext's fast_plot, characters that are not one cell
    of plain text, unhashable colours)."""
    if plt.monitor.fast_plot:
        return Text.from_ansi(plt.build())
    plt._set_sizes()
    plt._build_matrix()
    matrix = plt.monitor.matrix
    try:
        text = _matrix_text(matrix)
    except TypeError:  # a colour that is not hashable (a list, say)
        text = None
    if text is None:
        matrix.set_canvas()
        text = Text.from_ansi(matrix.get_canvas())
    return text


def _matrix_text(matrix: Any) -> Text | None:
    """A plotext character matrix as Rich text (see `figure_text`), or None where a cell is not
    one character of plain text."""
    import itertools

    import plotext._utility as ut
    from rich.text import Span

    styles: dict[tuple, Any] = {}  # (foreground, style, background) -> Rich style (None: plain)
    lines: list[str] = []
    spans: list[Span] = []
    offset = 0
    for row in reversed(range(matrix.rows)):  # plotext's row 0 is the bottom one
        line = "".join(matrix.marker[row])
        if len(line) != matrix.cols or "\x1b" in line or "\r" in line or "\n" in line:
            return None
        col = 0
        for colors, run in itertools.groupby(
            zip(matrix.fullground[row], matrix.style[row], matrix.background[row])
        ):
            end = col + sum(1 for _ in run)
            style = styles.get(colors, False)
            if style is False:
                parsed = Text.from_ansi(ut.colors_to_ansi(*colors) + "x" + ut.ansi_end).spans
                style = styles[colors] = parsed[0].style if parsed else None
            if style is not None:
                spans.append(Span(offset + col, offset + end, style))
            col = end
        lines.append(line)
        offset += len(line) + 1
    text = Text("\n".join([*lines, ""]), end="\n", tab_size=8)
    text.spans = spans
    return text


def content_from_text(text: Text, console: Any, ansi_theme: Any) -> Content:
    """What `Content.from_rich_text(text, console)` returns in an app whose ANSI theme is
    `ansi_theme`, converting each distinct Rich style to a Textual one once instead of once per
    span (a noisy figure has hundreds of colour runs and a handful of colours). Texts with a base
    style go to Textual's own conversion."""
    from textual.content import Span
    from textual.style import Style

    if text.style:
        return Content.from_rich_text(text, console=console)
    styles: dict[Any, Style] = {}
    spans = []
    for start, end, style in text.spans:
        converted = styles.get(style)
        if converted is None:
            rich_style = console.get_style(style) if isinstance(style, str) else style
            converted = styles[style] = Style.from_rich_style(rich_style, ansi_theme)
        spans.append(Span(start, end, converted))
    return Content(text.plain, spans)


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
        frame = content_from_text(text, self.app.console, self.app.ansi_theme)
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
