"""Generation prompts: each chat format's prompt ends with its assistant header (checked against the
reference encoders and transformers' generation prompt); prompt datasets and their collate."""

from __future__ import annotations

import pytest

from engine.data import (
    ChatMLFormat,
    DataError,
    Llama3ChatFormat,
    Message,
    MistralChatFormat,
    demo_prompt_dataset,
    extract_answer,
    prompt_collate,
    prompt_dataset,
    tokenize_prompt,
)

MSGS = [Message("system", "Be brief.", True), Message("user", "What is 2+2?", True)]


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_chatml_prompt(name, tok, rust):
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert (
        tokenize_prompt(tok(name), MSGS, ChatMLFormat())
        == rust(name).encode(text, add_special_tokens=False).ids
    )


def test_llama3_prompt(tok, rust):
    text = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert (
        tokenize_prompt(tok("llama3"), MSGS, Llama3ChatFormat())
        == rust("llama3").encode(text, add_special_tokens=False).ids
    )


def test_mistral_prompt(tok, tok_dir_of):
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(tok_dir_of("mistral7b_v01") / "tokenizer.model"))
    want = [sp.bos_id(), *sp.encode("[INST] Be brief.\n\nWhat is 2+2? [/INST]")]
    assert tokenize_prompt(tok("mistral7b_v01"), MSGS, MistralChatFormat()) == want


@pytest.mark.parametrize("name", ["qwen3", "llama3", "smollm2"])
def test_tokenizer_template_prompt_matches_transformers(name, tok, tok_dir_of):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tok_dir_of(name)))
    want = hf.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in MSGS], tokenize=True, add_generation_prompt=True
    )
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    assert tokenize_prompt(tok(name), MSGS, "tokenizer") == want


def test_plain_prompt_has_no_eos(tok, rust):
    t = tok("mistral7b_v01")
    ids = tokenize_prompt(t, [Message("user", "Question: 2+2?\n\nAnswer: ", True)])
    assert ids[0] == t.bos_id and ids[-1] != t.eos_id
    assert ids[1:] == rust("mistral7b_v01").encode("Question: 2+2?\n\nAnswer: ", add_special_tokens=False).ids


def test_prompt_dataset_on_gsm8k(tok, data_dir):
    t = tok("smollm2")
    ds = prompt_dataset(
        t,
        source=str(data_dir / "gsm8k_test.jsonl"),
        split="train[:6]",
        template="{question}",
        chat_format="chatml",
    )
    assert len(ds) == 6 and ds.source_names == ["gsm8k_test"]
    s = ds[0]
    assert t.decode(s["prompt_tokens"], skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert extract_answer(s["answer"]) is not None
    b = prompt_collate([ds[0], ds[1]])
    assert (
        b["prompts"][1] == ds[1]["prompt_tokens"]
        and b["answers"][0] == s["answer"]
        and b["source_ids"].tolist() == [0, 0]
    )
    with pytest.raises(DataError, match="more than max_prompt_len=5"):
        prompt_dataset(
            t,
            source=str(data_dir / "gsm8k_test.jsonl"),
            split="train[:3]",
            template="{question}",
            max_prompt_len=5,
        )


def test_demo_prompts(tok):
    t = tok("smollm2")
    ds = demo_prompt_dataset(t, n=40)
    assert len(ds) == 40
    text = t.decode(ds[0]["prompt_tokens"], skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n") and "####" in ds[0]["answer"]
