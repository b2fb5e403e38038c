"""KTO's unpaired rows (prompt, completion, label) -> tokens with the loss on the completion, a
`desirable` flag per sample, and one clear line for each kind of bad row."""

from __future__ import annotations

import json
import re

import pytest
import torch

from engine.data import DataError, padded_collate_unpaired, unpaired_dataset
from engine.rl.toy_task import DigitTokenizer


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_rows_become_masked_samples_with_labels(tmp_path):
    tok = DigitTokenizer()
    src = _write(tmp_path / "kto.jsonl", [
        {"prompt": "12>", "completion": "3", "label": True},
        {"prompt": "45>", "completion": "79", "label": False},
    ])  # fmt: skip
    ds = unpaired_dataset(tok, source=src, cache=False)
    assert len(ds) == 2 and ds.source_names == ["kto"]
    for i, (prompt, completion) in enumerate([("12>", "3"), ("45>", "79")]):
        s = ds[i]
        p = tok.encode(prompt, add_bos=True, add_eos=False)
        c = tok.encode(completion, add_bos=False, add_eos=True)
        assert s["tokens"] == p + c  # plain format: BOS + prompt + completion + EOS
        assert s["labels"] == [-100] * (len(p) - 1) + c + [-100]  # shifted; loss on the completion only
    batch = padded_collate_unpaired([ds[0], ds[1]], pad_id=tok.pad_id)
    assert batch["desirable"].tolist() == [True, False] and batch["desirable"].dtype == torch.bool
    assert batch["tokens"].shape == batch["labels"].shape == (2, len(ds[1]["tokens"]))


def test_column_map_renames_trl_style_columns(tmp_path):
    src = _write(tmp_path / "k.jsonl", [{"question": "1>", "answer": "2", "good": False}])
    ds = unpaired_dataset(
        DigitTokenizer(),
        source=src,
        cache=False,
        column_map={"prompt": "question", "completion": "answer", "label": "good"},
    )
    assert ds[0]["desirable"] is False


@pytest.mark.parametrize(
    "row, field, what",
    [
        ({"prompt": "1>", "completion": "2"}, "label", "missing or null"),
        ({"prompt": "1>", "completion": "2", "label": "yes"}, "label", "expected true .desirable. or false"),
        ({"prompt": "1>", "completion": "2", "label": 1}, "label", "got int"),
        ({"prompt": "1>", "label": True}, "completion", "empty"),
        ({"completion": "2", "label": True}, "prompt", "empty"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, row, field, what):
    good = {"prompt": "3>", "completion": "4", "label": True}
    src = _write(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(DataError) as e:
        unpaired_dataset(DigitTokenizer(), source=src, cache=False)
    msg = str(e.value)
    assert "\n" not in msg and "bad.jsonl" in msg and f"row 1 field '{field}'" in msg, msg
    assert re.search(what, msg), msg
    ds = unpaired_dataset(DigitTokenizer(), source=src, cache=False, skip_bad_rows=True)
    assert len(ds) == 1 and ds.skipped == 1


def test_demo_unpaired_round_trips_through_the_cache(tmp_path, monkeypatch):
    from engine.data import demo_preference_rows, demo_unpaired_dataset
    from engine.data.cache import cache_dir
    from engine.training.model_setup import build_tokenizer

    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path))
    tok = build_tokenizer({"_component_": "engine.data.tokenizers.load_tokenizer", "path": "demo"})
    fresh = demo_unpaired_dataset(tok, n=6, max_seq_len=192)
    assert len(list(cache_dir().glob("*.npz"))) == 1
    cached = demo_unpaired_dataset(tok, n=6, max_seq_len=192)
    assert fresh.desirable.tolist() == cached.desirable.tolist() == [True, False] * 3
    assert [fresh[i] for i in range(6)] == [cached[i] for i in range(6)]
    rows = demo_preference_rows(6)
    for i in range(6):  # the loss is on the completion (right answer, then a wrong one), not the question
        trained = tok.decode([t for t in fresh[i]["labels"] if t != -100])
        assert rows[i]["chosen" if i % 2 == 0 else "rejected"] in trained
        assert rows[i]["question"] not in trained
