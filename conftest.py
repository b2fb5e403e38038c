"""Root pytest configuration: repo paths, the shared assets, thread limits, marker handling."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
# The offline assets beside the project; TUNEBENCH_SHARED_ASSETS points elsewhere (a missing path
# measures what a bare clone runs: `TUNEBENCH_SHARED_ASSETS=/nonexistent pytest ...`).
SHARED_ASSETS = Path(os.environ.get("TUNEBENCH_SHARED_ASSETS") or REPO.parent / "shared" / "assets")

os.environ.setdefault("OMP_NUM_THREADS", "2")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture
def shared_assets() -> Path:
    """The offline assets beside the project (`../shared/assets`); skips when absent."""
    if not SHARED_ASSETS.is_dir():
        pytest.skip(f"{SHARED_ASSETS} is absent (tests that need the shared assets skip without it)")
    return SHARED_ASSETS


@pytest.fixture
def tunebench_home(tmp_path, monkeypatch) -> Path:
    """A private TUNEBENCH_HOME for one test."""
    home = tmp_path / "tbhome"
    monkeypatch.setenv("TUNEBENCH_HOME", str(home))
    monkeypatch.delenv("TUNEBENCH_RUN_ID", raising=False)
    return home
