"""Golden token/label sequences for each chat format, written from each format's published layout
(Meta's llama3 ChatFormat, ChatML, Meta's llama chat_completion, Mistral v1) and encoded by the
reference encoders (the `tokenizers` library, SentencePiece, transformers). Labels follow torchtune
0.6.1's layout (a trained turn trains its header) unless `mask_headers`; the comparison with
torchtune itself is in test_torchtune_parity.py."""

from __future__ import annotations

import pytest

from engine.data import (
    ChatMLFormat,
    Llama2ChatFormat,
    Llama3ChatFormat,
    Message,
    MistralChatFormat,
    TokenizerChatTemplate,
    shifted_labels,
    tokenize_messages,
)

CONV = [
    Message("system", "Be brief.", masked=True),
    Message("user", "What is 2+2?", masked=True),
    Message("assistant", "It is 4.", masked=False),
    Message("user", "And 3+3?", masked=True),
    Message("assistant", "Six.", masked=False),
]


def _golden(encode, pieces):
    """Expected (ids, mask) from (text or id list, masked) pieces."""
    ids, mask = [], []
    for piece, masked in pieces:
        p = piece if isinstance(piece, list) else encode(piece)
        ids += p
        mask += [masked] * len(p)
    return ids, mask


def _check(got, want):
    ids, mask = got
    w_ids, w_mask = want
    assert ids == w_ids
    assert mask == w_mask
    assert shifted_labels(ids, mask) == [
        w_ids[i + 1] if not w_mask[i + 1] else -100 for i in range(len(w_ids) - 1)
    ] + [-100]


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])  # SmolLM2: the repo's demo tokenizer, own ids
def test_chatml(name, tok, rust):
    # ChatML: <|im_start|>{role}\n{content}<|im_end|>\n. torchtune's labels: every token of a turn takes
    # the turn's mask (an assistant turn trains its header); the newline after the last turn is masked
    # (torchtune's sample ends at <|im_end|>; tests/engine/data/test_torchtune_parity.py runs torchtune).
    ref = rust(name)

    def enc(t):
        return ref.encode(t, add_special_tokens=False).ids

    text = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\nIt is 4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\nSix.<|im_end|>\n"
    )
    want = _golden(
        enc,
        [
            ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n", True),
            ("<|im_start|>assistant\nIt is 4.<|im_end|>\n", False),
            ("<|im_start|>user\nAnd 3+3?<|im_end|>\n", True),
            ("<|im_start|>assistant\nSix.<|im_end|>", False),
            ("\n", True),
        ],
    )
    assert want[0] == enc(text)  # the pieces tokenize like the whole conversation
    _check(tokenize_messages(tok(name), CONV, ChatMLFormat()), want)
    # mask_headers: only "{content}<|im_end|>" of assistant turns is trained.
    want_masked = _golden(
        enc,
        [
            (
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
                True,
            ),
            ("It is 4.<|im_end|>", False),
            ("\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n", True),
            ("Six.<|im_end|>", False),
            ("\n", True),
        ],
    )
    _check(tokenize_messages(tok(name), CONV, ChatMLFormat(mask_headers=True)), want_masked)
    assert tokenize_messages(tok(name), CONV, "chatml")[0] == enc(text)  # the format's name


CONV_SPACED = [  # contents with surrounding whitespace, which Meta's format strips
    Message("system", "  Be brief.\n", masked=True),
    Message("user", "What is 2+2?\n\n", masked=True),
    Message("assistant", "\nIt is 4. ", masked=False),
]


def test_llama3_format(tok, rust, meta_llama3):
    # Llama 3, per Meta's reference ChatFormat (meta-llama/llama3, llama/tokenizer.py).
    ref = rust("llama3")

    def enc(t):
        return ref.encode(t, add_special_tokens=False).ids

    for conv in (CONV, CONV_SPACED):
        want = meta_llama3(enc, conv)
        ids, _ = want
        assert ids[0] == 128000 and ids.count(128009) == len(conv)  # <|begin_of_text|>, one <|eot_id|> each
        _check(tokenize_messages(tok("llama3"), conv, Llama3ChatFormat()), want)
        _check(
            tokenize_messages(tok("llama3"), conv, Llama3ChatFormat(mask_headers=True)),
            meta_llama3(enc, conv, mask_headers=True),
        )
    # The assistant header is trained by default: the label after the user's <|eot_id|> is
    # <|start_header_id|>.
    ids, mask = tokenize_messages(tok("llama3"), CONV_SPACED, Llama3ChatFormat())
    labels = shifted_labels(ids, mask)
    first_eot_of_user = [i for i, t in enumerate(ids) if t == 128009][1]
    assert labels[first_eot_of_user] == 128006


def _sp(mistral_dir):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(mistral_dir / "tokenizer.model"))


def test_llama2_format(tok, tok_dir_of):
    # Meta's llama chat_completion: per exchange BOS + encode(f"[INST] {user} [/INST] {answer} ") + EOS,
    # system folded into the first user turn as "<<SYS>>\n{system}\n<</SYS>>\n\n".
    sp = _sp(tok_dir_of("mistral7b_v01"))
    bos, eos = sp.bos_id(), sp.eos_id()
    first_prompt = "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 2+2? [/INST]"
    ex1 = sp.encode(first_prompt + " It is 4. ")
    ex2 = sp.encode("[INST] And 3+3? [/INST] Six. ")
    n1, n2 = len(sp.encode(first_prompt)), len(sp.encode("[INST] And 3+3? [/INST]"))
    assert ex1[:n1] == sp.encode(first_prompt)  # the prompt's tokens are a prefix of the exchange's
    want_ids = [bos, *ex1, eos, bos, *ex2, eos]
    want_mask = (
        [True] * (1 + n1) + [False] * (len(ex1) - n1 + 1) + [True] * (1 + n2) + [False] * (len(ex2) - n2 + 1)
    )
    _check(tokenize_messages(tok("mistral7b_v01"), CONV, Llama2ChatFormat()), (want_ids, want_mask))


def test_mistral_format(tok, tok_dir_of):
    # Mistral v1: <s>[INST] {system}\n\n{user} [/INST]{answer}</s>[INST] {user} [/INST]{answer}</s>,
    # each instruction and answer encoded on its own.
    sp = _sp(tok_dir_of("mistral7b_v01"))
    u1 = sp.encode("[INST] Be brief.\n\nWhat is 2+2? [/INST]")
    a1 = sp.encode("It is 4.")
    u2 = sp.encode("[INST] And 3+3? [/INST]")
    a2 = sp.encode("Six.")
    want_ids = [sp.bos_id(), *u1, *a1, sp.eos_id(), *u2, *a2, sp.eos_id()]
    want_mask = [True] * (1 + len(u1)) + [False] * (len(a1) + 1) + [True] * len(u2) + [False] * (len(a2) + 1)
    _check(tokenize_messages(tok("mistral7b_v01"), CONV, MistralChatFormat()), (want_ids, want_mask))


TRAINED_TEMPLATE_TURNS = {  # default layout: each trained turn from its header to its end marker
    "qwen3": "<|im_start|>assistant\nIt is 4.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nSix.<|im_end|>",
    "smollm2": "<|im_start|>assistant\nIt is 4.<|im_end|>\n<|im_start|>assistant\nSix.<|im_end|>",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nSix.<|eot_id|>",
}


@pytest.mark.parametrize("name", ["qwen3", "llama3", "smollm2"])
def test_tokenizer_own_template_matches_transformers(name, tok, rust, tok_dir_of):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tok_dir_of(name)))
    conv = [{"role": m.role, "content": m.content} for m in CONV]
    want = hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=False)
    want = list(want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want)
    ref = rust(name)
    ids, mask = tokenize_messages(tok(name), CONV, TokenizerChatTemplate())
    assert ids == want
    trained = [i for i, m in zip(ids, mask) if not m]
    # The trained turns' text (the Qwen3 template puts an empty think block before the last answer).
    assert trained == ref.encode(TRAINED_TEMPLATE_TURNS[name], add_special_tokens=False).ids
    ids, mask = tokenize_messages(tok(name), CONV, TokenizerChatTemplate(mask_headers=True))
    assert ids == want
    end = "<|eot_id|>" if name == "llama3" else "<|im_end|>"
    trained = [i for i, m in zip(ids, mask) if not m]
    assert trained == ref.encode(f"It is 4.{end}Six.{end}", add_special_tokens=False).ids


def test_truncation_keeps_final_token(tok):
    t = tok("smollm2")
    ids, mask = tokenize_messages(t, CONV, ChatMLFormat())
    short, smask = tokenize_messages(t, CONV, ChatMLFormat(), max_seq_len=20)
    assert len(short) == 20 and short[:19] == ids[:19] and short[-1] == ids[-1] and smask[-1] == mask[-1]


def test_tokenizer_template_train_on_input(tok, rust):
    conv = [Message("user", "What is 2+2?", masked=False), Message("assistant", "It is 4.", masked=False)]
    ids, mask = tokenize_messages(tok("qwen3"), conv, TokenizerChatTemplate())
    trained = [i for i, m in zip(ids, mask) if not m]
    text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nIt is 4.<|im_end|>"
    assert trained == rust("qwen3").encode(text, add_special_tokens=False).ids
    ids, mask = tokenize_messages(tok("qwen3"), conv, TokenizerChatTemplate(mask_headers=True))
    trained = [i for i, m in zip(ids, mask) if not m]
    text = "What is 2+2?<|im_end|>It is 4.<|im_end|>"
    assert trained == rust("qwen3").encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("fmt", [Llama2ChatFormat(), MistralChatFormat()])
def test_sentencepiece_backend_gives_the_same_ids(fmt, tok, tok_dir_of):
    from engine.data.tokenizers import load_tokenizer

    sp_tok = load_tokenizer(tok_dir_of("mistral7b_v01") / "tokenizer.model")
    assert tokenize_messages(sp_tok, CONV, fmt) == tokenize_messages(tok("mistral7b_v01"), CONV, fmt)
