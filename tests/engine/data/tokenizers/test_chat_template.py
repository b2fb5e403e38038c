"""Chat templates from `tokenizer_config.json` render the strings the models were trained on."""

from __future__ import annotations

import json

import pytest

from engine.data.tokenizers import ChatTemplateError, TokenizerError, load_tokenizer, render_chat_template

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]


def test_llama3_template(tok_dir):
    tok = load_tokenizer(tok_dir / "llama3")
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True
    )
    assert ids == [128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271]


def test_qwen3_template_thinking_switch(tok_dir):
    tok = load_tokenizer(tok_dir / "qwen3")
    head = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(CONVERSATION, add_generation_prompt=True) == head
    no_think = tok.apply_chat_template(CONVERSATION, add_generation_prompt=True, enable_thinking=False)
    assert no_think == head + "<think>\n\n</think>\n\n"
    assert tok.apply_chat_template(CONVERSATION[:2]) == head[: head.index("<|im_start|>assistant")]


@pytest.mark.parametrize("name", ["qwen3", "llama3", "smollm2"])
def test_matches_transformers(tok_dir, tok_dir_of, name):
    transformers = pytest.importorskip("transformers")
    # SmolLM2's own template (the shared tokenizer.json has no tokenizer_config.json): the repo's rebuild
    folder = tok_dir_of(name) if name == "smollm2" else tok_dir / name
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    tok = load_tokenizer(folder)
    for gen in (False, True):
        expected = ref.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=gen)
        assert tok.apply_chat_template(CONVERSATION, add_generation_prompt=gen) == expected
        ids = ref.apply_chat_template(CONVERSATION, tokenize=True, add_generation_prompt=gen)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert tok.apply_chat_template(CONVERSATION, add_generation_prompt=gen, tokenize=True) == list(ids)


def test_template_errors_are_one_line():
    with pytest.raises(ChatTemplateError, match="chat template refused the messages: only user"):
        render_chat_template("{{ raise_exception('only user') }}", [])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat_template("{% for m in messages %}", [])
    # The sandbox refuses Python internals.
    with pytest.raises(ChatTemplateError, match="failed while rendering"):
        render_chat_template("{{ messages.append.__self__.clear() }}", [{"role": "user", "content": "x"}])


def test_no_template_names_the_file(tmp_path, tok_dir):
    (tmp_path / "tokenizer.json").write_bytes((tok_dir / "smollm2" / "tokenizer.json").read_bytes())
    tok = load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": [{"name": "default", "template": "{{ messages[0]['content'] }}!"}]})
    )
    assert load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "x!"
