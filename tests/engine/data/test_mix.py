"""Dataset mixes: the torchtune YAML list from issue 4 (local stand-ins), weighted mixes, source ids."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from engine.config import load_config, validate
from engine.data import ConcatDataset, DataError, PackedDataset, build_dataset, instruct_dataset, mix

# Verbatim from issue 4 (the torchtune documentation's example with our component path).
ISSUE_YAML = """\
dataset:
  - _component_: engine.data.instruct_dataset   # our path, same arguments
    source: vicgalle/alpaca-gpt4
    template: engine.data.AlpacaInstructTemplate
    split: train
    train_on_input: True
  - _component_: engine.data.instruct_dataset
    source: samsum
    template: engine.data.SummarizeTemplate
    column_map:
      output: summary
    split: train
    train_on_input: False
"""


@pytest.fixture
def samsum_standin(tmp_path):
    rows = [
        {
            "id": str(i),
            "dialogue": f"Ann: shall we meet at {i}?\nBob: yes, at {i} sharp.",
            "summary": f"They meet at {i}.",
        }
        for i in range(1, 13)
    ]
    f = tmp_path / "samsum_train.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    return f


def test_issue_yaml_mix_parses_validates_builds(tok, data_dir, tmp_path, samsum_standin):
    cfg_file = tmp_path / "mix.yaml"
    cfg_file.write_text(ISSUE_YAML)
    alpaca = data_dir / "alpaca_data_cleaned_1000.json"
    cfg = load_config(cfg_file, [f"dataset.0.source={alpaca}", f"dataset.1.source={samsum_standin}"])
    assert validate(cfg) == []
    t = tok("smollm2")
    ds = build_dataset(cfg["dataset"], t)
    part_a = instruct_dataset(
        t, source=str(alpaca), template="engine.data.AlpacaInstructTemplate", train_on_input=True
    )
    part_b = instruct_dataset(
        t,
        source=str(samsum_standin),
        template="engine.data.SummarizeTemplate",
        column_map={"output": "summary"},
    )
    assert isinstance(ds, ConcatDataset)
    assert len(ds) == len(part_a) + len(part_b) == 1000 + 12
    assert ds.source_names == ["alpaca_data_cleaned_1000", "samsum_train"]
    assert ds[0] == part_a[0] and ds[999]["source_id"] == 0
    assert ds[1000]["tokens"] == part_b[0]["tokens"] and ds[1000]["source_id"] == 1
    # train_on_input: True trains the Alpaca prompt; False masks the SAMSum prompt.
    assert ds[0]["labels"][0] != -100 and ds[1000]["labels"][0] == -100


def test_validate_reports_bad_mix_entry(tmp_path):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text(ISSUE_YAML.replace("column_map:", "colum_map:"))
    problems = validate(load_config(cfg_file))
    assert any("colum_map" in str(p) for p in problems)


def _rows(prefix, n):
    return [{"input": f"{prefix} question {i}", "output": f"{prefix} answer {i}"} for i in range(n)]


def test_weighted_mix_ratios_and_epochs(tok):
    t = tok("smollm2")
    a = instruct_dataset(t, source=_rows("alpha", 40), name="alpha")
    b = instruct_dataset(t, source=_rows("beta", 10), name="beta")
    m = mix(datasets=[a, b], weights=[1, 3], num_samples=100, seed=1)
    assert len(m) == 100 and m.source_names == ["alpha", "beta"]
    counts = Counter(m[i]["source_id"] for i in range(len(m)))
    assert counts == {0: 25, 1: 75}
    # beta (10 rows) is oversampled: each row appears 7 or 8 times; alpha's 25 are distinct rows
    beta_rows = Counter(tuple(m[i]["tokens"]) for i in range(len(m)) if m[i]["source_id"] == 1)
    assert len(beta_rows) == 10 and set(beta_rows.values()) <= {7, 8}
    alpha_rows = {tuple(m[i]["tokens"]) for i in range(len(m)) if m[i]["source_id"] == 0}
    assert len(alpha_rows) == 25
    order0 = [m[i]["tokens"] for i in range(len(m))]
    m.set_epoch(1)
    assert [m[i]["tokens"] for i in range(len(m))] != order0
    m.set_epoch(0)
    assert [m[i]["tokens"] for i in range(len(m))] == order0  # deterministic per (seed, epoch)
    # default epoch: as many samples as the concatenation
    assert len(mix(datasets=[a, b], weights=[1, 1])) == 50


def test_mix_from_yaml_node_and_packing(tok, tmp_path):
    t = tok("smollm2")
    f1, f2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    f1.write_text("\n".join(json.dumps(r) for r in _rows("alpha", 8)))
    f2.write_text("\n".join(json.dumps(r) for r in _rows("beta", 8)))
    node = {
        "_component_": "engine.data.mix",
        "weights": [1, 1],
        "num_samples": 16,
        "datasets": [
            {"_component_": "engine.data.instruct_dataset", "source": str(f1)},
            [  # a nested concatenation is one more level of source ids
                {"_component_": "engine.data.instruct_dataset", "source": str(f2), "name": "beta"},
                {"_component_": "engine.data.instruct_dataset", "source": str(f2), "name": "beta"},
            ],
        ],
    }
    m = build_dataset(node, t)
    assert m.source_names == ["a", "beta", "beta_1"]
    assert {m[i]["source_id"] for i in range(len(m))} == {0, 1, 2}
    packed = PackedDataset(m, max_seq_len=64)
    ids = {s for i in range(len(packed)) for s in packed[i]["source_ids"]}
    assert ids == {-1, 0, 1, 2} or ids == {0, 1, 2}


def test_mix_errors(tok):
    a = instruct_dataset(tok("smollm2"), source=_rows("alpha", 4))
    with pytest.raises(DataError, match="weights"):
        mix(datasets=[a, a], weights=[1])
    with pytest.raises(DataError, match="non-negative"):
        mix(datasets=[a], weights=[-1])
    with pytest.raises(DataError, match="needs one weight"):
        build_dataset(
            {
                "_component_": "engine.data.mix",
                "datasets": [{"_component_": "engine.data.instruct_dataset", "source": _rows("x", 2)}],
            },
            tok("smollm2"),
        )


def test_parts_must_agree_on_packing(tok):
    t = tok("smollm2")
    plain = instruct_dataset(t, source=_rows("alpha", 4))
    packed = instruct_dataset(t, source=_rows("beta", 4), packed=True, max_seq_len=64)
    with pytest.raises(DataError, match="mix packed and unpacked"):
        ConcatDataset([plain, packed])
    both = ConcatDataset([packed, instruct_dataset(t, source=_rows("gamma", 4), packed=True, max_seq_len=64)])
    assert both.packed and both.max_seq_len == 64 and "document_ids" in both[0]


def test_validate_checks_preset_arguments():
    problems = [
        str(p)
        for p in validate(
            {"dataset": {"_component_": "engine.data.gsm8k_dataset", "max_seq_lenn": 5, "packed": "yes"}}
        )
    ]
    assert any("max_seq_lenn" in p and "did you mean 'max_seq_len'" in p for p in problems)
    assert any("dataset.packed" in p and "bool" in p for p in problems)
    assert (
        validate(
            {"dataset": {"_component_": "engine.data.wikitext_dataset", "packed": True, "max_seq_len": 512}}
        )
        == []
    )


def test_packed_mix_holds_several_sources_per_pack(tok):
    t = tok("smollm2")
    node = {
        "_component_": "engine.data.mix",
        "weights": [1, 1],
        "packed": True,
        "max_seq_len": 128,
        "datasets": [
            {"_component_": "engine.data.instruct_dataset", "source": _rows("alpha", 12), "name": "alpha"},
            {"_component_": "engine.data.instruct_dataset", "source": _rows("beta", 12), "name": "beta"},
        ],
    }
    packed = build_dataset(node, t)
    assert isinstance(packed, PackedDataset) and packed.source_names == ["alpha", "beta"]
    assert any({0, 1} <= set(packed[i]["source_ids"]) for i in range(len(packed)))
    assert packed.stats()["samples"] == 24


def test_parts_must_hold_one_sample_kind(tok):
    from engine.data import preference_dataset

    t = tok("smollm2")
    sft = instruct_dataset(t, source=_rows("alpha", 4))
    pref = preference_dataset(t, source=[{"prompt": "p", "chosen": "a", "rejected": "b"}] * 3)
    with pytest.raises(DataError, match="different sample kinds"):
        ConcatDataset([sft, pref])
    assert mix(datasets=[pref, pref], weights=[1, 1]).kind == "preference"
