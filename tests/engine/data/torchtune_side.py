"""The torchtune 0.6.1 side of test_torchtune_parity.py: run with torchtune's own venv
(bench/.venv-torchtune/bin/python), never imported by the project's tests.

    python tests/engine/data/torchtune_side.py --assets ../shared/assets --work DIR --out out.json

Builds torchtune's own tokenizers from the shared tokenizer files, with no tunebench code:
  - Llama 3: torchtune's tiktoken-based `Llama3Tokenizer` needs a tiktoken BPE file; it is written
    from `tokenizer.json`'s vocabulary (ids are tiktoken ranks; each token's bytes come from the
    byte-level alphabet), the conversion Meta's tokenizer.json was made by, run backwards; built by
    torchtune's public `llama3_tokenizer(path)` with its own special-token table (the ids of the
    tokens the layout uses are checked against the file's added tokens).
  - Qwen: torchtune's `Qwen2_5Tokenizer` (its own pure-Python byte-level BPE) reads `vocab.json` and
    `merges.txt`, written from `tokenizer.json`'s model; built by `qwen2_5_tokenizer(...,
    special_tokens_path=tokenizer.json)`.
Then it runs torchtune's dataset builders / message transforms / prompt templates on the rows and
writes, per case, the samples' ``tokens`` and torchtune's (unshifted) ``labels`` as JSON.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from pathlib import Path


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable bytes as themselves, the rest from U+0100 on); written
    here rather than imported, since this side runs without tunebench on its path."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def llama3_tokenizer(folder: Path, work: Path):
    from torchtune.models.llama3 import llama3_tokenizer as build

    data = json.loads((folder / "tokenizer.json").read_text())
    alphabet = byte_level_alphabet()
    lines = [
        f"{base64.b64encode(bytes(alphabet[c] for c in tok)).decode()} {rank}"
        for tok, rank in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    ]
    path = work / "llama3_tiktoken.model"
    path.write_text("\n".join(lines) + "\n")
    tok = build(str(path))  # torchtune's Llama 3 special-token table
    added = {a["content"]: a["id"] for a in data["added_tokens"]}  # the file is Llama 3.0: no <|eom_id|>
    for name, got in (
        ("<|begin_of_text|>", tok.bos_id),
        ("<|end_of_text|>", tok.eos_id),
        ("<|start_header_id|>", tok.start_header_id),
        ("<|end_header_id|>", tok.end_header_id),
        ("<|eot_id|>", tok.eot_id),
    ):
        assert added[name] == got, name
    return tok


def qwen_tokenizer(folder: Path, work: Path):
    from torchtune.models.qwen2_5 import qwen2_5_tokenizer

    data = json.loads((folder / "tokenizer.json").read_text())
    vocab_path, merges_path = work / "qwen_vocab.json", work / "qwen_merges.txt"
    vocab_path.write_text(json.dumps(data["model"]["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    merges_path.write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return qwen2_5_tokenizer(
        str(vocab_path), str(merges_path), special_tokens_path=str(folder / "tokenizer.json")
    )


def samples(ds) -> list[dict]:
    return [{"tokens": list(map(int, s["tokens"])), "labels": list(map(int, s["labels"]))} for s in ds]


def template_text(template, messages) -> str:
    """The user turn's text after torchtune's prompt template: its content parts, joined."""
    return "".join(part["content"] for part in template(messages)[0].content if part["type"] == "text")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--qwen-rows", type=int, default=300, help="rows for the Qwen cases (its BPE is Python)")
    args = ap.parse_args()
    assets, work = Path(args.assets), Path(args.work)
    os.environ.setdefault("HF_HOME", str(work / "hf"))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from torchtune.data import (
        AlpacaToMessages,
        ChatMLTemplate,
        GrammarErrorCorrectionTemplate,
        InputOutputToMessages,
        Message,
        QuestionAnswerTemplate,
        SummarizeTemplate,
    )
    from torchtune.datasets import alpaca_dataset, chat_dataset, text_completion_dataset

    alpaca = str(assets / "data/alpaca_data_cleaned_1000.json")
    conversations = str(assets / "data/dummy_conversation.json")
    llama3 = llama3_tokenizer(assets / "tokenizers/llama3", work)
    qwen = qwen_tokenizer(assets / "tokenizers/qwen3", work)
    n_q = args.qwen_rows
    out: dict = {}
    for tio in (False, True):
        out[f"alpaca_llama3_tio{int(tio)}"] = samples(
            alpaca_dataset(llama3, source="json", data_files=alpaca, split="train", train_on_input=tio)
        )
    rows = json.loads(Path(alpaca).read_text())
    # The user turn's text as torchtune's Alpaca transform writes it, for Meta's layout in the test.
    out["alpaca_prompts"] = [AlpacaToMessages()(r)["messages"][0].text_content for r in rows]
    out["alpaca_spaces_prompt"] = AlpacaToMessages()(
        {"instruction": "Name a colour.", "input": "  ", "output": "Blue."}
    )["messages"][0].text_content
    out["alpaca_qwen_tio0"] = samples(
        alpaca_dataset(qwen, source="json", data_files=alpaca, split=f"train[:{n_q}]", train_on_input=False)
    )
    out["sharegpt_qwen"] = samples(
        chat_dataset(
            qwen,
            source="json",
            data_files=conversations,
            split=f"train[:{n_q}]",
            conversation_column="conversations",
            conversation_style="sharegpt",
        )
    )
    out["text_llama3"] = samples(
        text_completion_dataset(llama3, source="json", data_files=alpaca, column="output", split="train")
    )
    # Task templates on the Alpaca rows (instruction as the template's field).
    to_messages = InputOutputToMessages(column_map={"input": "instruction", "output": "output"})
    templates = {
        "grammar": GrammarErrorCorrectionTemplate(),
        "summarize": SummarizeTemplate(),
        "qa": QuestionAnswerTemplate(),
        "chatml": ChatMLTemplate(),
    }
    for name, template in templates.items():
        msgs = [to_messages(r)["messages"] for r in rows[:n_q]]
        if name == "chatml":  # the prompt: the user turn and an empty assistant turn to complete
            out["template_chatml"] = [
                "".join(p["content"] for m in template([m[0], Message("assistant", "")]) for p in m.content)
                for m in msgs
            ]
            continue
        out[f"template_{name}"] = [template_text(template, m) for m in msgs]
        # torchtune's own path for these templates: the tokenizer applies the template and encodes
        # each text part of the user turn on its own (Llama 3: each part stripped).
        for tok_name, tok in (("qwen", qwen), ("llama3", llama3)):
            tok.prompt_template = template
            out[f"template_{name}_{tok_name}_decoded"] = [
                tok.decode(tok.tokenize_messages(m)[0], skip_special_tokens=False) for m in msgs[:50]
            ]
            tok.prompt_template = None
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
