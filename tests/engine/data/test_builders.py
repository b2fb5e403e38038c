"""Dataset builders on the real local files in ../shared/assets/data, bad input, skip counts, cache."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from engine.config import ConfigError
from engine.data import (
    DataError,
    chat_dataset,
    gsm8k_dataset,
    hh_rlhf_dataset,
    instruct_dataset,
    preference_dataset,
    text_completion_dataset,
)
from engine.data import cache as data_cache


def _trained_text(t, sample):
    toks, labels = sample["tokens"], sample["labels"]
    return t.decode([labels[i] for i in range(len(toks)) if labels[i] != -100], skip_special_tokens=False)


def test_instruct_alpaca_local(tok, data_dir):
    t = tok("smollm2")
    ds = instruct_dataset(
        t,
        source=str(data_dir / "alpaca_data_cleaned_1000.json"),
        template="engine.data.AlpacaInstructTemplate",
        split="train[:50]",
    )
    rows = json.loads((data_dir / "alpaca_data_cleaned_1000.json").read_text())[:50]
    assert len(ds) == 50 and ds.source_names == ["alpaca_data_cleaned_1000"]
    s = ds[0]
    assert s["source_id"] == 0 and len(s["tokens"]) == len(s["labels"])
    assert _trained_text(t, s) == rows[0]["output"] + "<|im_end|>"  # response + EOS, prompt masked


def test_gsm8k_preset_local_with_max_seq_len(tok, data_dir):
    t = tok("smollm2")
    ds = gsm8k_dataset(t, source=str(data_dir / "gsm8k_test.jsonl"), split="train[:40]", max_seq_len=64)
    assert len(ds) == 40 and ds.source_names == ["gsm8k"]
    assert max(len(ds[i]["tokens"]) for i in range(40)) == 64
    assert all(ds[i]["tokens"][-1] == t.eos_id for i in range(40))  # truncation keeps EOS


def test_chat_sharegpt_local(tok, data_dir):
    t = tok("smollm2")
    ds = chat_dataset(
        t, source=str(data_dir / "dummy_conversation.json"), split="train[:20]", chat_format="chatml"
    )
    conv = json.loads((data_dir / "dummy_conversation.json").read_text())[0]["conversations"]
    # torchtune's layout: a trained turn trains "<|im_start|>assistant\n{content}<|im_end|>\n"; the
    # newline after the last turn is masked.
    gpt = [turn["value"] for turn in conv if turn["from"] == "gpt"]
    answers = "".join(f"<|im_start|>assistant\n{v}<|im_end|>\n" for v in gpt)
    assert _trained_text(t, ds[0]) == answers.removesuffix("\n")
    masked = chat_dataset(
        t,
        source=str(data_dir / "dummy_conversation.json"),
        split="train[:20]",
        chat_format="chatml",
        mask_headers=True,
    )
    assert _trained_text(t, masked[0]) == "".join(v + "<|im_end|>" for v in gpt)


def test_chat_openai_tokenizer_template(tok, tmp_path):
    t = tok("smollm2")
    f = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": f"{i}."}]}
        for i in range(3)
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    ds = chat_dataset(t, source=str(f))
    assert len(ds) == 3
    assert _trained_text(t, ds[2]).endswith("2.<|im_end|>")


def test_preference_hh_gz(tok, data_dir):
    t = tok("smollm2")
    ds = hh_rlhf_dataset(
        t, source=str(data_dir / "hh_harmless_base_test.jsonl.gz"), split="train[:30]", max_seq_len=256
    )
    assert len(ds) + ds.skipped == 30
    s = ds[0]
    row = json.loads(gzip.open(data_dir / "hh_harmless_base_test.jsonl.gz", "rt").readline())
    last = row["chosen"].rsplit("\n\nAssistant: ", 1)[1]
    trained = t.decode([x for x in s["chosen_labels"] if x != -100])
    assert trained.strip() == last.strip()[: len(trained.strip())]
    assert s["chosen_tokens"] != s["rejected_tokens"]


def test_text_completion_txt(tok, shared_data):
    t = tok("llama3")
    ds = text_completion_dataset(
        t, source=str(shared_data / "tinyshakespeare_input.txt"), split="train[:100]"
    )
    assert len(ds) + ds.filtered == 100 and ds.filtered > 0  # blank lines dropped
    assert t.decode(ds[0]["tokens"]) == "First Citizen:"
    assert all(x != -100 for x in ds[0]["labels"][:-1])


def test_column_map_and_summarize(tok, tmp_path):
    f = tmp_path / "samsum.csv"
    f.write_text('dialogue,summary\n"A: hi\nB: yo",They greet.\n')
    ds = instruct_dataset(
        tok("smollm2"),
        source=str(f),
        template="engine.data.SummarizeTemplate",
        column_map={"output": "summary"},
    )
    assert _trained_text(tok("smollm2"), ds[0]) == "They greet.<|im_end|>"


def _write(tmp_path, name, rows):
    f = tmp_path / name
    f.write_text("\n".join(json.dumps(r) for r in rows))
    return str(f)


def test_missing_column_names_source_row_field(tok, tmp_path):
    src = _write(
        tmp_path, "d.jsonl", [{"instruction": "a", "output": "b"}, {"instruction": "c", "answer": "d"}]
    )
    with pytest.raises(DataError) as e:
        instruct_dataset(tok("smollm2"), source=src, template="engine.data.AlpacaInstructTemplate")
    msg = str(e.value)
    assert "d.jsonl" in msg and "row 1" in msg and "'output'" in msg and "\n" not in msg
    assert isinstance(e.value, ConfigError)


def test_skip_bad_rows_reports_count(tok, tmp_path, caplog):
    rows = [
        {"input": "q", "output": "a"},
        {"input": "q", "output": ""},
        {"input": "q", "output": "b"},
        {"input": 3, "output": "c"},
    ]
    src = _write(
        tmp_path, "d.jsonl", [{k: str(v) if k == "output" else v for k, v in r.items()} for r in rows[:3]]
    )
    with caplog.at_level("WARNING", logger="engine.data"):
        ds = instruct_dataset(tok("smollm2"), source=src, skip_bad_rows=True)
    assert len(ds) == 2 and ds.skipped == 1
    assert "skipped 1 of 3 rows" in caplog.text and "row 1" in caplog.text


def test_template_unknown_field(tok, tmp_path):
    src = _write(tmp_path, "d.jsonl", [{"question": "a", "output": "b"}])
    with pytest.raises(DataError, match=r"reads field \{prompt\}, which is not a column"):
        instruct_dataset(tok("smollm2"), source=src, template="Q: {prompt}\nA: ")


def test_non_conversation_row(tok, tmp_path):
    src = _write(tmp_path, "c.jsonl", [{"conversations": "hello there"}])
    with pytest.raises(DataError, match=r"row 0 field 'conversations': is not a conversation"):
        chat_dataset(tok("smollm2"), source=src, chat_format="chatml")


def test_empty_and_unreadable_sources(tok, tmp_path):
    t = tok("smollm2")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.jsonl"):
        instruct_dataset(t, source=str(empty))
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="broken.json.*cannot be read"):
        instruct_dataset(t, source=str(bad))
    with pytest.raises(DataError, match="no such file"):
        instruct_dataset(t, source=str(tmp_path / "missing.jsonl"))
    odd = tmp_path / "data.xlsx"
    odd.write_text("x")
    with pytest.raises(DataError, match="unsupported file type"):
        instruct_dataset(t, source=str(odd))


def test_filter_fn(tok):
    rows = [{"input": f"q{i}", "output": f"a{i}"} for i in range(10)]
    ds = instruct_dataset(tok("smollm2"), source=rows, filter_fn=lambda r: int(r["input"][1:]) % 2 == 0)
    assert len(ds) == 5 and ds.filtered == 5


def test_preference_shapes(tok):
    t = tok("smollm2")
    rows = [
        {
            "chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
            "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}],
        }
    ]
    ds = preference_dataset(t, source=rows, chat_format="chatml")
    assert (
        t.decode([x for x in ds[0]["rejected_labels"] if x != -100], skip_special_tokens=False)
        == "<|im_start|>assistant\nGo away.<|im_end|>"
    )
    ds = preference_dataset(t, source=rows, chat_format="chatml", mask_headers=True)
    assert (
        t.decode([x for x in ds[0]["chosen_labels"] if x != -100], skip_special_tokens=False)
        == "Hello!<|im_end|>"
    )


def test_cache_reuses_and_invalidates(tok, tmp_path, monkeypatch):
    t = tok("smollm2")
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"input": "what is it", "output": "a"}))
    a = instruct_dataset(t, source=str(src))
    entries = list(data_cache.cache_dir().glob("*.npz"))
    assert len(entries) == 1
    import engine.data.dataset as dataset_mod

    real_load = dataset_mod.load_rows

    def no_reading(*args, **kwargs):
        raise AssertionError("the source was read although the cache holds it")

    monkeypatch.setattr(dataset_mod, "load_rows", no_reading)
    b = instruct_dataset(t, source=str(src))  # served from the cache: the file is not read
    assert a[0] == b[0] and len(list(data_cache.cache_dir().glob("*.npz"))) == 1
    monkeypatch.setattr(dataset_mod, "load_rows", real_load)
    src.write_text(json.dumps({"input": "what is it", "output": "a longer answer"}))
    os.utime(src, ns=(1, 2))  # a new mtime (and size) -> a new key
    c = instruct_dataset(t, source=str(src))
    assert len(c[0]["tokens"]) > len(a[0]["tokens"]) and len(list(data_cache.cache_dir().glob("*.npz"))) == 2
    d = instruct_dataset(t, source=str(src), train_on_input=True)  # settings are part of the key
    assert d[0]["labels"] != c[0]["labels"]
    assert data_cache.clear() == 3 and not list(data_cache.cache_dir().glob("*"))


def test_presets_with_local_sources(tok, shared_data, tmp_path):
    from engine.data import alpaca_cleaned_dataset, slimorca_dataset, wikitext_dataset

    t = tok("smollm2")
    a = alpaca_cleaned_dataset(
        t, source=str(shared_data / "alpaca_data_cleaned_1000.json"), split="train[:10]"
    )
    assert (
        len(a) == 10 and a.source_names == ["alpaca_cleaned"] and a[0]["labels"][0] != -100
    )  # trains on input
    s = slimorca_dataset(t, source=str(shared_data / "dummy_conversation.json"), split="train[:5]")
    assert len(s) == 5 and s.source_names == ["slimorca"]
    w = wikitext_dataset(
        t,
        source=str(shared_data / "tinyshakespeare_input.txt"),
        split="train[:200]",
        packed=True,
        max_seq_len=128,
    )
    assert w.packed and len(w[0]["tokens"]) == 128 and w.efficiency > 0.8
    # a folder of files is one source
    folder = tmp_path / "parts"
    folder.mkdir()
    for k in range(2):
        (folder / f"p{k}.jsonl").write_text(
            "\n".join(json.dumps({"input": f"q{k}{i}", "output": "a"}) for i in range(3))
        )
    assert len(instruct_dataset(t, source=str(folder))) == 6


def test_yaml_prompt_template_node(tok, tmp_path):
    from engine.config import instantiate

    node = {
        "_component_": "engine.data.instruct_dataset",
        "source": [{"q": "2+2?", "a": "4"}],
        "template": {"_component_": "engine.data.PromptTemplate", "template": "Q: {q}\nA:"},
        "column_map": {"output": "a"},
        "chat_format": "engine.data.ChatMLFormat",
    }
    ds = instantiate(node, tokenizer=tok("smollm2"))
    text = tok("smollm2").decode(ds[0]["tokens"], skip_special_tokens=False)
    assert text == "<|im_start|>user\nQ: 2+2?\nA:<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"


def test_column_filter_from_yaml_is_cached(tok, tmp_path):
    from engine.config import instantiate

    src = _write(
        tmp_path,
        "d.jsonl",
        [{"input": f"q{i}", "output": "a", "lang": "en" if i % 3 else "fr"} for i in range(9)],
    )
    node = {
        "_component_": "engine.data.instruct_dataset",
        "source": src,
        "filter_fn": {"_component_": "engine.data.ColumnFilter", "column": "lang", "equals": "en"},
    }
    ds = instantiate(node, tokenizer=tok("smollm2"))
    assert len(ds) == 6 and ds.filtered == 3
    assert len(list(data_cache.cache_dir().glob("*.npz"))) == 1


def test_unknown_split_of_local_file(tok, tmp_path):
    src = _write(tmp_path, "d.jsonl", [{"input": "q", "output": "a"}])
    with pytest.raises(DataError, match="split 'validation' does not exist.*only the 'train' split"):
        instruct_dataset(tok("smollm2"), source=src, split="validation")


def test_text_packing_continues_long_documents(tok, tmp_path):
    t = tok("smollm2")
    f = tmp_path / "doc.txt"
    f.write_text(" ".join(f"word{i}" for i in range(300)) + "\n")
    ds = text_completion_dataset(t, source=str(f), packed=True, max_seq_len=64)
    whole = t.encode(" ".join(f"word{i}" for i in range(300)), add_bos=True, add_eos=True)
    assert len(ds) == -(-len(whole) // 64)  # not truncated: the document fills several packs
    got = [x for i in range(len(ds)) for x, s in zip(ds[i]["tokens"], ds[i]["source_ids"]) if s >= 0]
    assert got == whole


def test_split_must_be_a_name(tok, data_dir):
    with pytest.raises(DataError, match="split: expected a split name"):
        instruct_dataset(tok("smollm2"), source=str(data_dir / "gsm8k_test.jsonl"), split=None)


def test_datasets_pickle_for_loader_workers(tok):
    import pickle

    from engine.data import ConcatDataset, PackedDataset, mix

    t = tok("smollm2")
    rows = [
        {"conversations": [{"from": "human", "value": f"hi {i}"}, {"from": "gpt", "value": "yo"}]}
        for i in range(6)
    ]
    a = chat_dataset(t, source=rows, chat_format="chatml", cache=False)
    for d in (a, mix(datasets=[a, a], weights=[1, 2]), PackedDataset(ConcatDataset([a, a]), 64)):
        assert pickle.loads(pickle.dumps(d))[0] == d[0]


def test_text_document_packs_a_whole_file(tok, shared_data):
    t = tok("smollm2")
    ds = text_completion_dataset(
        t,
        source=str(shared_data / "tinyshakespeare_input.txt"),
        sample_by="document",
        packed=True,
        max_seq_len=4096,
    )
    assert ds.stats()["samples"] == 1 and len(ds) > 50  # one document continued over many packs
    assert ds.efficiency > 0.99
    assert t.decode(ds[0]["tokens"][:4]).startswith("First Citizen")


def test_preset_template_override(tok, data_dir):
    ds = gsm8k_dataset(
        tok("smollm2"),
        source=str(data_dir / "gsm8k_test.jsonl"),
        split="train[:2]",
        template="Q: {question}\nA: ",
    )
    assert tok("smollm2").decode(ds[0]["tokens"]).startswith("Q: ")


@pytest.mark.slow  # spawns two workers that import torch and rebuild the tokenizer (~30 s on a busy 2-core box)
def test_num_proc_workers_match_one_process(tok, tmp_path):
    t = tok("smollm2")
    rows = [{"input": f"question {i}?", "output": f"answer {i}" if i != 37 else ""} for i in range(80)]
    one = instruct_dataset(t, source=rows, skip_bad_rows=True, cache=False)
    two = instruct_dataset(t, source=rows, skip_bad_rows=True, cache=False, num_proc=2)
    assert len(one) == len(two) == 79 and two.skipped == 1
    assert all(one[i] == two[i] for i in range(len(one)))
    with pytest.raises(DataError, match="row 37 field 'output'"):
        instruct_dataset(t, source=rows, cache=False, num_proc=2)
