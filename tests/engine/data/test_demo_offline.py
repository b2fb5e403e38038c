"""The demo data needs nothing from ../shared: a byte-level BPE tokenizer trained here on the demo rows
(with the `tokenizers` library) loads through `load_tokenizer`, and the demo dataset builds, packs and
collates with it."""

from __future__ import annotations

import json

from engine.data import demo_dataset, demo_rows, extract_answer, packed_collate, preview_sample

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _train_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rows = demo_rows(500)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator((r["question"] + "\n" + r["answer"] for r in rows), trainer)
    folder.mkdir()
    bpe.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML})
    )


def test_demo_without_shared_assets(tmp_path):
    from engine.data.tokenizers import load_tokenizer

    _train_tokenizer(tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    ds = demo_dataset(tok, n=200, max_seq_len=256)
    assert len(ds) == 200 and ds.skipped == 0
    p = preview_sample(ds, 0, tok)
    trained = "".join(t for t, masked in p.segments if not masked)
    # torchtune's layout: the trained assistant turn includes its header.
    assert trained == "<|im_start|>assistant\n" + demo_rows(1)[0]["answer"] + "<|im_end|>"
    assert extract_answer(trained.removesuffix("<|im_end|>")) is not None
    masked_headers = demo_dataset(tok, n=2, max_seq_len=256, mask_headers=True)
    p = preview_sample(masked_headers, 0, tok)
    assert "".join(t for t, masked in p.segments if not masked) == demo_rows(1)[0]["answer"] + "<|im_end|>"
    packed = demo_dataset(tok, n=200, packed=True, max_seq_len=256)
    batch = packed_collate([packed[0], packed[1]])
    assert batch["tokens"].shape == (2, 256) and packed.efficiency > 0.8
