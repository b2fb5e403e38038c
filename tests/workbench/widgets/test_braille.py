"""Golden text of the braille plot renderer: frames of known curves compared with output worked out
by hand (dot bits per cell, tick values, rows and columns, label placement), and the tick helpers."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.widgets.braille import (
    AXIS,
    LABEL,
    braille_cells,
    line_pixels,
    nice_ticks,
    note_frame,
    render_plot,
    tick_labels,
)


def _curve(xs, ys):
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def test_a_diagonal_line_is_one_dot_per_pixel_column_and_row():
    """(0, 7) -> (7, 0) in pixels (y = 0 the top row) on 4 x 2 cells: one pixel per column. The
    bottom cell row holds pixel rows 4..7: columns 0, 1 at rows 7, 6 (dots 7 and 6: 0x40 | 0x20 =
    U+2860 "⡠"), columns 2, 3 at rows 5, 4 (dots 2 and 4: 0x02 | 0x08 = U+280A "⠊"); the top
    cell row the same two cells three columns over."""
    x, y = line_pixels(np.array([0, 7]), np.array([7, 0]))
    assert x.tolist() == list(range(8)) and y.tolist() == list(range(7, -1, -1))
    cells = braille_cells(x, y, 4, 2)
    assert cells.tolist() == [[0, 0, 0x60, 0x0A], [0x60, 0x0A, 0, 0]]


def test_line_pixels_steps_the_longer_axis_and_rounds_halves_up():
    # 4 columns, 2 rows down: y at steps 1/4, 2/4, 3/4 of 2 -> 0.5, 1, 1.5 -> rounded up 1, 1, 2
    x, y = line_pixels(np.array([0, 4]), np.array([0, 2]))
    assert x.tolist() == [0, 1, 2, 3, 4] and y.tolist() == [0, 1, 1, 2, 2]
    # a repeated point adds nothing; the end point comes once
    x, y = line_pixels(np.array([0, 0, 2]), np.array([3, 3, 3]))
    assert x.tolist() == [0, 1, 2] and y.tolist() == [3, 3, 3]
    # pixels outside the canvas are dropped, a pixel twice counts once
    assert braille_cells(np.array([0, 0, 5, -1]), np.array([0, 0, 0, 0]), 2, 1).tolist() == [[0x01, 0]]


def test_frame_of_a_straight_line_with_axes_ticks_and_labels():
    """x and y from 0 to 7 on a 6 x 4 frame. y: 2 canvas rows (8 pixel rows), at most 3 ticks ->
    step 5 (steps 1 and 2 give 8 and 4): ticks 0 and 5 at pixel rows 7 and 2 from the top, so rows 1
    and 0; labels one character wide, so the canvas is 6 - 2 = 4 cells (8 pixel columns): one pixel
    per column and row, the diagonal above. x: at most 2 ticks -> 0 and 5 at pixel columns 0 and 5,
    cells 0 and 2, labels centred under them."""
    frame = render_plot([_curve([0, 7], [0, 7])], ["a"], 6, 4)
    assert frame.lines == [
        "5┤  ⡠⠊",
        "0┤⡠⠊  ",
        " └┬─┬─",
        "  0 5 ",
    ]
    assert frame.spans == [
        [(0, 1, LABEL), (1, 2, AXIS), (4, 6, 0)],
        [(0, 1, LABEL), (1, 2, AXIS), (2, 4, 0)],
        [(1, 6, AXIS)],
        [(2, 3, LABEL), (4, 5, LABEL)],
    ]


def test_two_curves_with_a_legend_and_the_later_curve_on_top():
    """a at y = 0 and b at y = 1, x from 0 to 9, on 16 x 6. y: 4 rows (16 pixel rows), at most 3
    ticks -> step 0.5: 0.0, 0.5, 1.0 at pixel rows 15, 7, 0 from the top (the 0.5 one rounds
    7.5 up to pixel 8 from the bottom), so rows 3, 1, 0; labels 3 wide, canvas 12 cells. a is the
    bottom dot row of the bottom cells (dots 7 and 8: "⣀"), b the top dot row of the top cells
    (dots 1 and 4: "⠉"). The legend takes the top right: "━ a" in a's colour over b's line, "━ b"
    below. x: 2 ticks at most -> 0 and 5, pixel columns 0 and round(5 * 23 / 9) = 13, cells 0, 6."""
    frame = render_plot([_curve([0, 9], [0, 0]), _curve([0, 9], [1, 1])], ["a", "b"], 16, 6)
    assert frame.lines == [
        "1.0┤⠉⠉⠉⠉⠉⠉⠉⠉⠉━ a",
        "0.5┤         ━ b",
        "   │            ",
        "0.0┤⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀",
        "   └┬─────┬─────",
        "    0     5     ",
    ]
    assert frame.spans == [
        [(0, 3, LABEL), (3, 4, AXIS), (4, 13, 1), (13, 16, 0)],
        [(0, 3, LABEL), (3, 4, AXIS), (13, 16, 1)],
        [(3, 4, AXIS)],
        [(0, 3, LABEL), (3, 4, AXIS), (4, 16, 0)],
        [(3, 16, AXIS)],
        [(4, 5, LABEL), (10, 11, LABEL)],
    ]


def test_every_line_is_the_frame_width_for_noisy_curves_and_odd_sizes():
    rng = np.random.default_rng(0)
    x = np.arange(1, 641, dtype=np.float64)
    curves = [_curve(x, 2000 + 50 * rng.random(640)) for _ in range(5)]
    for width, height in ((158, 18), (37, 41), (9, 3), (60, 5)):
        frame = render_plot(curves, [f"run-{k}" for k in range(5)], width, height)
        assert len(frame.lines) == height and all(len(line) == width for line in frame.lines)
        for line, runs in zip(frame.lines, frame.spans):
            assert all(0 <= s < e <= len(line) for s, e, _ in runs)


def test_no_points_too_small_and_flat_curves():
    assert render_plot([], [], 20, 5, note="loss: no data yet").lines[2] == " loss: no data yet  "
    assert render_plot([_curve([], [])], ["a"], 20, 5, note="x").lines == note_frame("x", 20, 5).lines
    assert render_plot([_curve([1, 2], [3, 4])], ["a"], 20, 2).lines == [" " * 20] * 2  # no room for axes
    # a flat curve sits mid-height (range widened by 5 %); one point is one dot
    frame = render_plot([_curve([1, 2, 3], [5, 5, 5])], ["a"], 30, 10)
    drawn = [r for r, line in enumerate(frame.lines[:8]) if any("⠀" < ch <= "⣿" for ch in line)]
    assert drawn == [3] or drawn == [4]
    frame = render_plot([_curve([1], [2])], ["a"], 30, 10)
    assert sum(ch > "⠀" and ch <= "⣿" for line in frame.lines for ch in line) == 1


@pytest.mark.parametrize(
    "lo,hi,most,ticks,step",
    [
        (1, 50_000, 10, [5000 * k for k in range(1, 11)], 5000),
        (0, 7, 3, [0, 5], 5),
        (0.0, 1.0, 3, [0.0, 0.5, 1.0], 0.5),
        (-3.0, 3.0, 4, [-2.0, 0.0, 2.0], 2.0),
        # step 0.05 leaves one tick (2.15): the next smaller step, 0.02, gives four
        (2.102, 2.18, 3, [2.12, 2.14, 2.16, 2.18], 0.02),
    ],
)
def test_nice_ticks(lo, hi, most, ticks, step):
    got, got_step = nice_ticks(lo, hi, most)
    assert got_step == pytest.approx(step) and got == pytest.approx(ticks)


def test_tick_labels_use_the_digits_the_step_needs():
    assert tick_labels([10_000.0, 20_000.0], 10_000.0) == ["10000", "20000"]
    assert tick_labels([-0.5, 0.0, 0.5], 0.5) == ["-0.5", "0.0", "0.5"]
    assert tick_labels([2.12, 2.14], 0.02) == ["2.12", "2.14"]
    assert tick_labels([5e-05, 1e-4, 1.5e-4], 5e-05) == ["5.0e-05", "1.0e-04", "1.5e-04"]
    assert tick_labels([-1e-17, 1.0], 1.0) == ["0", "1"]  # rounding noise next to zero is zero


def test_the_plot_screens_load_no_plotting_library():
    """The plots are ours: the Live and Compare screens import neither plotext nor textual-plotext."""
    import subprocess
    import sys

    code = (
        "import sys, workbench.screens.live, workbench.screens.compare_screen; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'plotext', 'textual_plotext', 'textual_plot'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_any_finite_curves_at_any_size_give_a_frame_of_that_size():
    """Random curves (flat, tiny or huge ranges, negative values, one point) at random sizes: no
    error, every line exactly the width, every span inside its line."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)

    @settings(max_examples=150, deadline=None)
    @given(
        curves=st.lists(st.lists(values, min_size=0, max_size=40), min_size=0, max_size=4),
        width=st.integers(1, 120),
        height=st.integers(1, 30),
        scale=st.sampled_from([1.0, 1e-9, 1e6]),
    )
    def check(curves, width, height, scale):
        drawn = [_curve(range(len(ys)), [v * scale for v in ys]) for ys in curves]
        frame = render_plot(drawn, [f"c{k}" for k in range(len(drawn))], width, height)
        assert len(frame.lines) == height and all(len(line) == width for line in frame.lines)
        assert all(0 <= s < e <= width for runs in frame.spans for s, e, _ in runs)

    check()
