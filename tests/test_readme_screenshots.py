"""The README's screenshots are the screen snapshots the suite checks, byte for byte, so a screen
change that updates its snapshot (`--snapshot-update`) shows up here until the picture is copied:
`cp tests/workbench/__snapshots__/test_screen_snapshots/test_<name>_screen.svg docs/screenshots/<name>.svg`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "tests" / "workbench" / "__snapshots__" / "test_screen_snapshots"
PICTURES = sorted(set(re.findall(r"docs/screenshots/([\w]+)\.svg", (ROOT / "README.md").read_text())))


def test_the_readme_shows_screenshots():
    assert len(PICTURES) >= 8, PICTURES


@pytest.mark.parametrize("name", PICTURES)
def test_screenshot_is_the_checked_snapshot(name):
    picture = ROOT / "docs" / "screenshots" / f"{name}.svg"
    base, _, variant = name.partition("_80x24")
    snapshot = SNAPSHOTS / f"test_{base}_screen{'_80x24' + variant if variant else ''}.svg"
    assert snapshot.is_file(), f"{picture.name} has no snapshot {snapshot.name}"
    assert picture.read_bytes() == snapshot.read_bytes(), f"copy {snapshot} to {picture}"
