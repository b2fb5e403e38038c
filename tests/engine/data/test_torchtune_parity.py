"""tunebench's data pipeline against torchtune 0.6.1 ITSELF on the same rows and tokenizer files, and
against Meta's published Llama 3 layout where torchtune departs from it.

Method. torchtune runs in its own venv (bench/.venv-torchtune, made by bench/torchtune_env.sh) in a
subprocess, `torchtune_side.py`, which writes JSON. Its tokenizers are torchtune's own classes, fed
the same vocabulary as tunebench's: torchtune's tiktoken `Llama3Tokenizer` from a tiktoken BPE file
written from the Llama 3 `tokenizer.json` (ids are tiktoken ranks; token bytes via the byte-level
alphabet), and torchtune's pure-Python `Qwen2_5Tokenizer` from `vocab.json`/`merges.txt` written from
the Qwen3 `tokenizer.json`. The rows go through torchtune's dataset builders (`alpaca_dataset`,
`chat_dataset`, `text_completion_dataset`), message transforms and prompt templates, so every
token and mask is torchtune's. Labels are compared shifted, as torchtune's recipes shift them
(``labels[1:] + [-100]``).

Where torchtune departs from the published layouts (tunebench follows the published ones):
  - Llama 3: torchtune appends a masked ``<|end_of_text|>`` after the last ``<|eot_id|>``; Meta's
    `ChatFormat.encode_dialog_prompt` has none. tunebench's tokens are torchtune's without it, and
    equal Meta's layout (`meta_llama3_layout` in conftest.py, encoded part by part as Meta does).
  - ChatML: torchtune ends the last turn at ``<|im_end|>``; the published layout (OpenAI's ChatML,
    Qwen's chat template) ends every turn with ``<|im_end|>\\n``. tunebench adds the newline, masked.
  - Task templates (grammar, summarize, QA): torchtune's tokenizers encode each text part of the
    templated user turn on its own and, for Llama 3, strip each part ("...standard English:Give...");
    Meta's layout encodes the message's whole content, stripped once. The prompt TEXT is compared with
    torchtune's; the tokens with Meta's layout of that text.
Skips, with the reason, when the torchtune venv or ../shared/assets is absent.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from engine.data import (
    AlpacaInstructTemplate,
    ChatMLTemplate,
    GrammarErrorCorrectionTemplate,
    Message,
    QuestionAnswerTemplate,
    SummarizeTemplate,
    chat_dataset,
    instruct_dataset,
    text_completion_dataset,
)

REPO = Path(__file__).resolve().parents[3]
TT_PYTHON = REPO / "bench" / ".venv-torchtune" / "bin" / "python"
SIDE = Path(__file__).with_name("torchtune_side.py")
QWEN_ROWS = 150  # the Qwen cases' rows in the default run (torchtune's Qwen BPE is pure Python)
NEWLINE_QWEN = 198


def _run_torchtune(shared_assets: Path, work: Path, qwen_rows: int) -> dict:
    if not TT_PYTHON.is_file():
        pytest.skip(
            f"{TT_PYTHON} is absent: run `bash bench/torchtune_env.sh` (or link bench/.venv-torchtune)"
        )
    out = work / "torchtune.json"
    cmd = [str(TT_PYTHON), str(SIDE), "--assets", str(shared_assets), "--work", str(work), "--out", str(out)]
    proc = subprocess.run([*cmd, "--qwen-rows", str(qwen_rows)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def torchtune_out(tmp_path_factory) -> dict:
    from conftest import SHARED_ASSETS

    if not SHARED_ASSETS.is_dir():
        pytest.skip(f"{SHARED_ASSETS} is absent (the comparison needs its rows and tokenizer files)")
    return _run_torchtune(SHARED_ASSETS, tmp_path_factory.mktemp("torchtune"), QWEN_ROWS)


def _shifted(labels: list[int]) -> list[int]:
    return labels[1:] + [-100]


def _enc(rust_tok):
    return lambda text: rust_tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("train_on_input", [False, True])
def test_alpaca_llama3_equals_torchtune_and_meta(
    train_on_input, torchtune_out, tok, rust, data_dir, meta_llama3
):
    ref = torchtune_out[f"alpaca_llama3_tio{int(train_on_input)}"]
    path = data_dir / "alpaca_data_cleaned_1000.json"
    rows = json.loads(path.read_text())
    ds = instruct_dataset(
        tok("llama3"),
        source=str(path),
        template=AlpacaInstructTemplate(),
        chat_format="llama3",
        train_on_input=train_on_input,
        cache=False,
    )
    assert len(ds) == len(ref) == len(rows) == 1000
    enc = _enc(rust("llama3"))
    for i, (want, row) in enumerate(zip(ref, rows)):
        got = ds[i]
        n = len(got["tokens"])
        # torchtune: the same tokens plus a masked <|end_of_text|>; the same labels.
        assert want["tokens"][:-1] == got["tokens"] and want["tokens"][-1] == 128001, i
        assert _shifted(want["labels"]) == got["labels"] + [-100], i
        # Meta's layout of torchtune's own prompt text and the row's output.
        prompt = torchtune_out["alpaca_prompts"][i]
        msgs = [Message("user", prompt, not train_on_input), Message("assistant", row["output"], False)]
        meta_ids, meta_mask = meta_llama3(enc, msgs)
        assert got["tokens"] == meta_ids and ds.mask(i) == meta_mask, i
        assert got["tokens"].count(128000) == 1 and n == len(meta_ids)
    # The prompt ends in "### Response:\n"; stripped, as Meta and torchtune do, it ends in ":".
    assert torchtune_out["alpaca_prompts"][0].endswith("### Response:\n")
    first = ds[0]["tokens"]
    user_turn = tok("llama3").decode(first[: first.index(128009)], skip_special_tokens=False)
    assert user_turn.endswith("### Response:")


def _chatml_text(messages: list[Message]) -> str:
    return "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)


def _check_chatml(ds, ref: list[dict], conversations: list[list[Message]], rust_tok) -> None:
    enc = _enc(rust_tok)
    assert len(ds) >= len(ref) == len(conversations)
    for i, (want, msgs) in enumerate(zip(ref, conversations)):
        got = ds[i]
        m = len(want["tokens"])
        # torchtune's tokens and labels, then the published layout's final newline (masked).
        assert got["tokens"] == want["tokens"] + [NEWLINE_QWEN], i
        assert got["labels"] == _shifted(want["labels"]) + [-100], i
        assert got["labels"][m - 1] == -100
        # The published layout: the conversation's ChatML text encoded as one string.
        assert got["tokens"] == enc(_chatml_text(msgs)), i


def test_chatml_qwen_equals_torchtune(torchtune_out, tok, rust, data_dir):
    qwen = tok("qwen3")
    path = data_dir / "alpaca_data_cleaned_1000.json"
    n = len(torchtune_out["alpaca_qwen_tio0"])
    rows = json.loads(path.read_text())[:n]
    ds = instruct_dataset(
        qwen, source=str(path), split=f"train[:{n}]", template=AlpacaInstructTemplate(), chat_format="chatml"
    )
    template = AlpacaInstructTemplate()
    convs = [[Message("user", template.format(r), True), Message("assistant", r["output"])] for r in rows]
    _check_chatml(ds, torchtune_out["alpaca_qwen_tio0"], convs, rust("qwen3"))

    path = data_dir / "dummy_conversation.json"
    n = len(torchtune_out["sharegpt_qwen"])
    ds = chat_dataset(qwen, source=str(path), split=f"train[:{n}]", chat_format="chatml")
    names = {"human": "user", "gpt": "assistant"}
    convs = [
        [Message(names[t["from"]], t["value"]) for t in row["conversations"]]
        for row in json.loads(path.read_text())[:n]
    ]
    _check_chatml(ds, torchtune_out["sharegpt_qwen"], convs, rust("qwen3"))


def test_text_completion_llama3_equals_torchtune(torchtune_out, tok, data_dir):
    # Plain text: BOS + text + EOS, every token trained; BOS exactly once although this llama3
    # tokenizer.json's post-processor adds none.
    ref = torchtune_out["text_llama3"]
    ds = text_completion_dataset(
        tok("llama3"), source=str(data_dir / "alpaca_data_cleaned_1000.json"), column="output"
    )
    assert len(ds) == len(ref) == 1000
    for i, want in enumerate(ref):
        got = ds[i]
        assert got["tokens"] == want["tokens"] and got["labels"] == _shifted(want["labels"]), i
        assert got["tokens"][0] == 128000 and got["tokens"].count(128000) == 1


TEMPLATES = {
    "grammar": (GrammarErrorCorrectionTemplate(), {"input": "instruction"}),
    "summarize": (SummarizeTemplate(), {"dialogue": "instruction"}),
    "qa": (QuestionAnswerTemplate(), {"question": "instruction"}),
    "chatml": (ChatMLTemplate(), {"input": "instruction"}),
}


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_templates_equal_torchtune_text_and_meta_tokens(
    name, torchtune_out, tok, rust, data_dir, meta_llama3
):
    template, column_map = TEMPLATES[name]
    texts = torchtune_out[f"template_{name}"]
    path = data_dir / "alpaca_data_cleaned_1000.json"
    rows = json.loads(path.read_text())[: len(texts)]
    for row, want in zip(rows, texts):
        mapped = {**row, **{k: row[v] for k, v in column_map.items()}}
        assert template.format(mapped) == want
    if name == "chatml":  # a plain-layout template: its tokens are checked in test_templates_golden.py
        return
    ds = instruct_dataset(
        tok("llama3"),
        source=str(path),
        split=f"train[:{len(texts)}]",
        template=template,
        column_map=column_map,
        chat_format="llama3",
    )
    enc = _enc(rust("llama3"))
    for i, (row, text) in enumerate(zip(rows, texts)):
        msgs = [Message("user", text, True), Message("assistant", row["output"], False)]
        assert ds[i]["tokens"] == meta_llama3(enc, msgs)[0], i
    # torchtune's own template path strips each part of the user turn (Llama 3) and only re-encodes
    # the parts separately (Qwen: same text); both show the departure named in the module docstring.
    prepend, append = {
        "grammar": ("Correct this to standard English: ", "\n---\nCorrected: "),
        "summarize": ("Summarize this dialogue:\n", "\n---\nSummary:\n"),
        "qa": ("Question: ", "\n\nAnswer: "),
    }[name]
    for row, decoded in zip(rows, torchtune_out[f"template_{name}_llama3_decoded"]):
        stripped = prepend.strip() + row["instruction"].strip() + append.strip()
        assert f"<|end_header_id|>\n\n{stripped}<|eot_id|>" in decoded
    for row, text, decoded in zip(rows, texts, torchtune_out[f"template_{name}_qwen_decoded"]):
        assert (
            decoded == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n{row['output']}<|im_end|>"
        )


def test_alpaca_input_of_spaces_keeps_the_input_prompt(torchtune_out):
    row = {"instruction": "Name a colour.", "input": "  ", "output": "Blue."}
    assert AlpacaInstructTemplate().format(row) == torchtune_out["alpaca_spaces_prompt"]
    assert "### Input:\n  \n\n" in torchtune_out["alpaca_spaces_prompt"]


@pytest.mark.slow
def test_chatml_qwen_all_rows_equal_torchtune(tok, rust, data_dir, tmp_path):
    from conftest import SHARED_ASSETS

    if not SHARED_ASSETS.is_dir():
        pytest.skip(f"{SHARED_ASSETS} is absent")
    out = _run_torchtune(SHARED_ASSETS, tmp_path, 1000)
    test_chatml_qwen_equals_torchtune(out, tok, rust, data_dir)
