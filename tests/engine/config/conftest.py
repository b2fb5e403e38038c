"""Fixtures for the config tests: a clean allow-list and a helper that writes YAML files."""

import textwrap

import pytest

from engine.config import reset_allowed_components


@pytest.fixture(autouse=True)
def _clean_allow_list(monkeypatch):
    monkeypatch.delenv("TUNEBENCH_ALLOW", raising=False)
    reset_allowed_components()
    yield
    reset_allowed_components()


@pytest.fixture
def write_yaml(tmp_path):
    def write(text: str, name: str = "cfg.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write
