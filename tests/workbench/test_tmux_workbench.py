"""The real terminal app under tmux: start `tunebench`, launch the demo run (SmolLM2-135M LoRA on the
generated demo dataset) from the Recipe screen, see the loss update, quit, reopen, and see the run
still going — quitting the workbench never stops a run.

Slow (the demo trains a 135M model on CPU): `pytest -m slow tests/workbench/test_tmux_workbench.py`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUNEBENCH = REPO / ".venv" / "bin" / "tunebench"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install -y tmux)"),
]


class Tmux:
    """One detached tmux session running a shell, driven with send-keys / capture-pane."""

    def __init__(self, name: str, env: dict[str, str], cwd: Path) -> None:
        self.name = name
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "40", "-c", str(cwd)], check=True
        )
        self.keys(f"export {exports} TERM=xterm-256color", "Enter")

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True, check=True
        ).stdout

    def wait(self, pattern: str, timeout: float = 60.0) -> re.Match:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            m = re.search(pattern, text)
            if m:
                return m
            time.sleep(0.5)
        raise AssertionError(f"{pattern!r} did not appear within {timeout}s; screen:\n{text}")

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], check=False)


def _step(tmux: Tmux, timeout: float = 300.0) -> int:
    return int(tmux.wait(r"step (\d+)/\d+", timeout).group(1))


def test_launch_demo_quit_reopen_still_running(tunebench_home, tmp_path):
    if not TUNEBENCH.exists():
        pytest.skip(f"{TUNEBENCH} is missing: run `make setup`")
    env = {"TUNEBENCH_HOME": str(tunebench_home), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    tmux = Tmux(f"tb-{os.getpid()}", env, tmp_path)
    try:
        tmux.keys(str(TUNEBENCH), "Enter")
        tmux.wait(r"Runs", 30)
        tmux.wait(r"0/0 runs", 30)
        # Recipe screen: the first built-in config is the demo (SmolLM2-135M LoRA) ...
        tmux.keys("F4")
        tmux.wait(r"recipe sft · lora", 60)
        tmux.wait(r"demo/smollm2_135m_lora", 10)
        # ... here made lighter (shorter sequences, smaller batches: a shared 2-core CPU) and loaded
        # through the "config file" box (ctrl+o).
        from engine.config import dump_config, parse_yaml

        demo = parse_yaml((REPO / "configs" / "demo" / "smollm2_135m_lora.yaml").read_text())
        demo["dataset"].update(n=400, max_seq_len=96)
        demo["batch_size"] = 2
        demo.setdefault("validation", {})["every_n_steps"] = 1000
        (tmp_path / "demo_light.yaml").write_text(
            dump_config(demo, header="tunebench run sft --config demo_light.yaml")
        )
        # Type once the screen has settled (its first memory estimate is shown).
        tmux.wait(r"total\s+[\d.]+ GiB", 300)
        tmux.keys("C-o")
        time.sleep(1)
        tmux.keys("demo_light.yaml")
        tmux.wait(r"│demo_light\.yaml", 30)
        tmux.keys("Enter")
        tmux.wait(r"batch size\s+2", 30)
        tmux.keys("F9")
        tmux.wait(r"Live run", 120)
        first = _step(tmux, 900)
        tmux.wait(r"loss \d", 120)
        # The loss keeps updating: a later step appears on the screen.
        deadline = time.monotonic() + 600
        while _step(tmux) <= first and time.monotonic() < deadline:
            time.sleep(1)
        seen = _step(tmux)
        assert seen > first, "the live screen did not advance"
        # Quit the app (back to Runs, then q): the shell prompt returns, the run goes on.
        tmux.keys("q")
        tmux.wait(r"runs, 1 running", 30)
        tmux.keys("q")
        time.sleep(2)
        assert "Live run" not in tmux.screen()
        # Reopen: the run is listed as running; enter opens it live and it is further along.
        tmux.keys(str(TUNEBENCH), "Enter")
        tmux.wait(r"1/1 runs, 1 running", 60)
        tmux.keys("Enter")
        tmux.wait(r"Live run", 30)
        deadline = time.monotonic() + 600
        while _step(tmux) <= seen and time.monotonic() < deadline:
            time.sleep(1)
        assert _step(tmux) > seen, "the reopened live screen shows the run still training"
        tmux.keys("q")
        tmux.keys("q")
    finally:
        tmux.kill()
        from engine.tracking.db import open_db
        from engine.tracking.readers import active_runs
        from workbench import launcher

        with open_db() as db:
            active = [r.id for r in active_runs(db=db)]
        for rid in active:
            launcher.stop(rid, grace_s=30, wait_s=30)
