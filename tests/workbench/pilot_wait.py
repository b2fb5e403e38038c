"""Waiting on a condition inside a Textual pilot test: the one helper every workbench app test uses
(CI shares 2 cores, so the deadline is generous and the test never sleeps a fixed time)."""

from __future__ import annotations

import time


async def wait_for(pilot, predicate, timeout: float = 120.0, what="condition"):
    """Let the app run until `predicate()` is truthy and return that value; fail after `timeout` s
    saying `what` (a string, or a callable giving the state at the time of failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
