"""The Playground in the real terminal app under tmux, as a new user meets it: `tunebench` on an empty
home, `a` opens the Playground on the demo model (SmolLM2-135M-Instruct, converted on first use), a
typed question is answered with Paris, `ctrl+s` stops a long answer mid-stream (the key reaches the
app in a real terminal: no XON/XOFF flow control), `escape` goes back to Runs and `q` quits.

Slow (a 135M model generating on CPU): `pytest -m slow tests/workbench/test_tmux_playground.py`.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest

from tests.workbench.test_tmux_workbench import TUNEBENCH, Tmux

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install -y tmux)"),
]


def test_empty_home_to_a_demo_answer_in_the_playground(tunebench_home, tmp_path):
    from engine.config import ConfigError
    from engine.models.demo_model import demo_gguf_path

    if not TUNEBENCH.exists():
        pytest.skip(f"{TUNEBENCH} is missing: run `make setup`")
    try:
        demo_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    env = {"TUNEBENCH_HOME": str(tunebench_home), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    tmux = Tmux(f"tb-pg-{os.getpid()}", env, tmp_path)
    try:
        tmux.keys(str(TUNEBENCH), "Enter")
        tmux.wait(r"0/0 runs", 60)
        tmux.keys("a")
        tmux.wait(r"Playground", 30)
        tmux.wait(r"ready · chat template", 600)  # the demo's first use converts its GGUF
        assert re.search(r"demo · SmolLM2-135M-Instruct", tmux.screen())
        tmux.keys("-l", "What is the capital of France?")
        tmux.keys("Enter")
        tmux.wait(r"> What is the capital of France\?", 30)
        tmux.wait(r"ended by stop token", 300)
        assert "Paris" in tmux.screen(), tmux.screen()
        # A long answer, stopped with ctrl+s once it has started.
        tmux.keys("-l", "Write a long story about a dragon who learns to bake bread.")
        tmux.keys("Enter")
        tmux.wait(r"generating…", 60)
        time.sleep(3)
        tmux.keys("C-s")
        tmux.wait(r"ended by stop key", 120)
        tmux.keys("Escape")
        tmux.wait(r"0/0 runs", 30)
        tmux.keys("q")
        deadline = time.monotonic() + 30
        while "0/0 runs" in tmux.screen() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "0/0 runs" not in tmux.screen()  # the app quit
    finally:
        tmux.kill()
