"""A tiny chat model folder made in the test, no ../shared needed: a random 2-layer native Llama saved
as a Hugging Face folder, a byte-level BPE trained here (with ChatML special tokens), and a ChatML
chat template in `tokenizer_config.json`. Loads in well under a second.

The output rows of tokens that are not printable ASCII (special tokens, stray bytes) are zero, so
greedy replies are readable text that never stops early: a reply is always `max_new_tokens` long."""

from __future__ import annotations

import json
from pathlib import Path

import torch

TEXT = (
    "the cat sat on the mat. the dog sat on the log. a cat and a dog sat.\n"
    "what is two plus two? two plus two is four. café, naïve, 東京.\n"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_tokenizer(folder: Path, *, chat_template: str | None = CHATML) -> list[str]:
    """`tokenizer.json` (+ `tokenizer_config.json`) in `folder`; returns each id's text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return [tok.decode([i], skip_special_tokens=False) for i in range(tok.get_vocab_size())]


def make_chat_model_dir(folder: Path, *, seed: int = 0, chat_template: str | None = CHATML) -> Path:
    """A complete HF model folder (config.json, model.safetensors, tokenizer files) at `folder`."""
    from engine.checkpoint import save_pretrained
    from engine.models.llama3 import llama3

    pieces = write_tokenizer(folder / "_tok", chat_template=chat_template)
    torch.manual_seed(seed)
    model = llama3(
        vocab_size=len(pieces),
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=64,
        intermediate_dim=128,
        max_seq_len=512,
    )
    with torch.no_grad():  # well-separated logits: greedy choices are not near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
        for i, text in enumerate(pieces):
            if text in SPECIALS or not (text.isascii() and text.isprintable()):
                model.output.weight[i] = 0.0  # logit 0: some printable token scores higher
    save_pretrained(model, folder)
    for f in (folder / "_tok").iterdir():
        f.rename(folder / f.name)
    (folder / "_tok").rmdir()
    return folder
