"""Line plots drawn as text: curves rasterised with numpy onto a braille canvas, with axes, ticks,
tick labels and a legend. No Textual here (the widget, `metric_plot.MetricPlot`, styles the result),
so a frame can be built in a worker thread and tested as plain text.

Each cell of the canvas is one braille character, 2 dots wide and 4 high (Unicode U+2800 plus a bit
per raised dot), so a `w` x `h` canvas is `2w` x `4h` pixels. A frame is laid out as

    <y labels>┤<canvas row>        one row per canvas row; "┤" where a y tick falls, else "│"
              └───┬─────┬───       the x axis, "┬" where an x tick falls
               <x tick labels>     each label centred under its tick (labels that would touch skipped)

The axis ranges are the data's own (all curves together); ticks are round values (1, 2 or 5 times a
power of ten) inside them. Later curves draw over earlier ones: a cell shows the dots of every curve
through it in the colour of the last one. With more than one curve the legend ("━ label", in the
curve's colour) sits in the top right corner of the canvas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BRAILLE = 0x2800  # the empty braille cell; raised dots add bits
# DOT[r, c]: the bit of the dot in row r (0 = top) and column c of a cell (Unicode numbers dots 1-3
# and 7 down the left column, 4-6 and 8 down the right)
DOT = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.int64)

# roles of a frame's cells (see `Frame.spans`); curves are numbered 0, 1, ...
NONE, AXIS, LABEL = -1, -2, -3
LEGEND_MARK = "━"


@dataclass(frozen=True)
class Frame:
    """A drawn plot: `lines` (each `width` characters) and, per line, `spans` (start, end, role)
    of the characters to colour: a curve's number, `AXIS` (axis lines) or `LABEL` (tick labels,
    the legend's marks use their curve's number, a note `LABEL`). Uncoloured text has no span."""

    lines: list[str]
    spans: list[list[tuple[int, int, int]]]


def nice_ticks(lo: float, hi: float, most: int) -> tuple[list[float], float]:
    """(ticks, step): the multiples in [lo, hi] of the smallest step of 1, 2 or 5 times a power of
    ten that gives at most `most` of them; the next smaller step where that one leaves fewer than
    two. `lo < hi`, both finite; `most` >= 2."""
    exponent = math.floor(math.log10((hi - lo) / most))
    previous: tuple[list[float], float] | None = None
    while True:
        for mantissa in (1, 2, 5):
            step = mantissa * 10.0**exponent
            first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
            ticks = [k * step for k in range(first, last + 1)]
            if len(ticks) <= most:
                return previous if len(ticks) < 2 and previous else (ticks, step)
            previous = ticks, step
        exponent += 1


def tick_labels(ticks: Sequence[float], step: float) -> list[str]:
    """Labels of `ticks` spaced `step` apart with just the digits that tell them apart: fixed point
    (up to 4 decimals, below 10^7), else scientific notation."""
    big = max(abs(t) for t in ticks)
    step_exp = math.floor(math.log10(step) + 1e-9)
    decimals = max(0, -step_exp)
    if decimals <= 4 and big < 1e7:
        return [f"{t:.{decimals}f}" if abs(t) >= step / 2 else f"{0:.{decimals}f}" for t in ticks]
    digits = max(0, math.floor(math.log10(big) + 1e-9) - step_exp)
    return [f"{t:.{digits}e}" for t in ticks]


def _limits(values: list[np.ndarray]) -> tuple[float, float]:
    """Min and max of all `values`, widened when they are one value (a flat curve sits mid-height)."""
    lo = min(float(v.min()) for v in values)
    hi = max(float(v.max()) for v in values)
    if hi > lo:
        return lo, hi
    pad = abs(lo) * 0.05 or 1.0
    return lo - pad, hi + pad


def _scale(values: np.ndarray, lo: float, hi: float, pixels: int) -> np.ndarray:
    """Values in [lo, hi] as pixel positions 0 .. pixels - 1 (nearest, halves up)."""
    return np.floor((values - lo) * ((pixels - 1) / (hi - lo)) + 0.5).astype(np.int64)


def line_pixels(px: np.ndarray, py: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pixels of the polyline through (px[i], py[i]): each segment stepped along its longer
    axis, one pixel per step (the other coordinate rounded, halves up), both ends included."""
    if len(px) < 2:
        return px, py
    dx, dy = np.diff(px), np.diff(py)
    steps = np.maximum(np.abs(dx), np.abs(dy))  # pixels per segment, its end left to the next one
    seg = np.repeat(np.arange(len(steps)), steps)
    i = np.arange(len(seg)) - np.repeat(np.cumsum(steps) - steps, steps)  # step within the segment
    frac = i / steps[seg]
    x = px[seg] + np.floor(frac * dx[seg] + 0.5).astype(np.int64)
    y = py[seg] + np.floor(frac * dy[seg] + 0.5).astype(np.int64)
    return np.append(x, px[-1]), np.append(y, py[-1])


def braille_cells(x: np.ndarray, y: np.ndarray, cols: int, rows: int) -> np.ndarray:
    """[rows, cols] dot bits of the pixels (x, y) (y = 0 the top pixel row) on a canvas of
    `cols` x `rows` cells; pixels outside are dropped, a pixel given twice counts once."""
    mask = np.zeros((rows * 4, cols * 2), dtype=bool)
    inside = (x >= 0) & (x < cols * 2) & (y >= 0) & (y < rows * 4)
    mask[y[inside], x[inside]] = True
    return (mask.reshape(rows, 4, cols, 2) * DOT[None, :, None, :]).sum(axis=(1, 3))


def _text(codes: np.ndarray) -> str:
    return codes.astype("<u4").tobytes().decode("utf-32-le")


def _runs(roles: np.ndarray, offset: int) -> list[tuple[int, int, int]]:
    """(start, end, role) of each run of equal roles in one row, uncoloured runs left out."""
    edges = np.flatnonzero(np.diff(roles)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [len(roles)]])
    return [
        (offset + int(s), offset + int(e), int(roles[s])) for s, e in zip(starts, ends) if roles[s] != NONE
    ]


def note_frame(note: str, width: int, height: int) -> Frame:
    """A blank frame with `note` centred (cut to the width) on its middle line."""
    lines = [" " * width] * height
    spans: list[list[tuple[int, int, int]]] = [[] for _ in range(height)]
    if height and note:
        text = note[:width]
        left = (width - len(text)) // 2
        lines[height // 2] = " " * left + text + " " * (width - left - len(text))
        spans[height // 2] = [(left, left + len(text), LABEL)]
    return Frame(lines, spans)


def render_plot(
    curves: Sequence[tuple[np.ndarray, np.ndarray]],
    labels: Sequence[str],
    width: int,
    height: int,
    *,
    note: str = "no data yet",
) -> Frame:
    """Draw `curves` (x and y as float arrays, finite, x ascending; named `labels`) in a `width` x
    `height` frame; `note` instead when no curve has a point or the frame is too small for axes."""
    drawn = [(curve, label) for curve, label in zip(curves, labels) if len(curve[0])]
    curves, labels = [c for c, _ in drawn], [label for _, label in drawn]
    rows = height - 2  # canvas rows: the x axis and its labels take two
    if not curves or rows < 1:
        return note_frame(note if not curves else "", width, height)
    xlo, xhi = _limits([x for x, _ in curves])
    ylo, yhi = _limits([y for _, y in curves])
    yticks, ystep = nice_ticks(ylo, yhi, max(3, min(10, rows // 2 + 1)))
    yrows = [(rows * 4 - 1 - int(p)) // 4 for p in _scale(np.array(yticks), ylo, yhi, rows * 4)]
    ylabels = tick_labels(yticks, ystep)
    margin = max(map(len, ylabels))
    cols = width - margin - 1
    if cols < 4:
        return note_frame("", width, height)

    # canvas: every curve's pixels as braille dots; a cell takes the colour of the last curve in it
    bits = np.zeros((rows, cols), dtype=np.int64)
    owner = np.full((rows, cols), NONE, dtype=np.int64)
    for k, (x, y) in enumerate(curves):
        px = _scale(x, xlo, xhi, cols * 2)
        py = rows * 4 - 1 - _scale(y, ylo, yhi, rows * 4)  # pixel row 0 is the top one
        cells = braille_cells(*line_pixels(px, py), cols, rows)
        bits |= cells
        owner[cells > 0] = k
    codes = np.where(bits > 0, BRAILLE + bits, ord(" "))
    if len(curves) > 1:
        _legend(codes, owner, labels)

    lines: list[str] = []
    spans: list[list[tuple[int, int, int]]] = []
    tick_rows = {}
    for r, label in zip(yrows, ylabels):
        tick_rows.setdefault(r, label)  # two ticks on one row: the first one's label
    for r in range(rows):
        label = tick_rows.get(r)
        left = (label or "").rjust(margin)
        row_spans = [(margin - len(label), margin, LABEL)] if label else []
        row_spans.append((margin, margin + 1, AXIS))
        lines.append(left + ("┤" if label is not None else "│") + _text(codes[r]))
        spans.append(row_spans + _runs(owner[r], margin + 1))

    xticks, xstep = nice_ticks(xlo, xhi, max(2, min(10, cols // 10 + 1)))
    xcols = [int(p) // 2 for p in _scale(np.array(xticks), xlo, xhi, cols * 2)]
    axis = ["─"] * cols
    for c in xcols:
        axis[c] = "┬"
    lines.append(" " * margin + "└" + "".join(axis))
    spans.append([(margin, width, AXIS)])
    under, under_spans = _x_labels(tick_labels(xticks, xstep), [margin + 1 + c for c in xcols], width)
    lines.append(under)
    spans.append(under_spans)
    return Frame(lines, spans)


def _x_labels(labels: list[str], centres: list[int], width: int) -> tuple[str, list[tuple[int, int, int]]]:
    """One line of `labels`, each centred on its column (shifted inside the line at the edges);
    a label that would touch the previous one is left out."""
    line = [" "] * width
    spans = []
    free = 0  # the first column a label may use (one blank after the previous label)
    for label, centre in zip(labels, centres):
        start = min(max(centre - len(label) // 2, 0), width - len(label))
        if start < free or len(label) > width:
            continue
        line[start : start + len(label)] = label
        spans.append((start, start + len(label), LABEL))
        free = start + len(label) + 1
    return "".join(line), spans


def _legend(codes: np.ndarray, owner: np.ndarray, labels: Sequence[str]) -> None:
    """Write "━ label" for each curve into the top right corner of the canvas (`codes`, `owner`),
    one curve a row, as many as there are rows; labels cut to two thirds of the canvas width."""
    rows, cols = codes.shape
    keep = max(1, cols * 2 // 3 - 2)
    entries = [f"{LEGEND_MARK} {label[:keep]}" for label in labels[:rows]]
    wide = max(map(len, entries))
    for k, entry in enumerate(entries):
        entry = entry.ljust(wide)
        start = cols - wide
        codes[k, start:] = [ord(ch) for ch in entry]
        owner[k, start:] = k
