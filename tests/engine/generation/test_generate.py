"""Generation against references: transformers' greedy `generate` on the same weights, our own
full-forward loop without a cache, each prompt alone versus the padded batch, and softmax for sampling."""

from __future__ import annotations

import importlib

import pytest
import torch

from engine.generation import GenerationError, filter_logits, generate, sample_next_token
from engine.models import from_pretrained

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 1], [42]]


def _reference(tmp_path, family: str):
    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,  # well-separated logits: greedy choices are not near-ties
    )
    if family == "llama":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        cls = transformers.LlamaForCausalLM
    else:
        cfg = transformers.Qwen3Config(**common, head_dim=16, tie_word_embeddings=True)
        cls = transformers.Qwen3ForCausalLM
    torch.manual_seed(0)
    ref = cls(cfg).eval()
    ref.save_pretrained(tmp_path / family)
    return ref, from_pretrained(tmp_path / family, dtype=torch.float32)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _reference(tmp_path_factory.mktemp("gen"), "llama")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_batch_equals_transformers(tmp_path, family):
    ref, model = _reference(tmp_path, family)
    out = generate(model, PROMPTS, max_new_tokens=12)
    assert out.tokens.shape == (len(PROMPTS), 12)
    for prompt, completion in zip(PROMPTS, out.completions):
        expected = ref.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :]
        assert completion == expected.tolist()


def test_cache_equals_full_forward_and_single_prompts(llama):
    _, model = llama
    batched = generate(model, PROMPTS, max_new_tokens=10)
    no_cache = generate(model, PROMPTS, max_new_tokens=10, use_cache=False)
    assert torch.equal(batched.tokens, no_cache.tokens)
    for prompt, completion in zip(PROMPTS, batched.completions):
        assert generate(model, [prompt], max_new_tokens=10).completions[0] == completion
    assert not model.caches_are_enabled()  # caches are removed after the call


def test_stop_tokens_end_rows_independently(llama):
    _, model = llama
    free = generate(model, PROMPTS, max_new_tokens=10)
    stop = free.tokens[0, 2].item()  # row 0's third token
    first_hit = [row.index(stop) if stop in row else None for row in free.tokens.tolist()]
    out = generate(model, PROMPTS, max_new_tokens=10, stop_tokens=[stop], pad_id=255)
    for r, hit in enumerate(first_hit):
        if hit is None:
            assert out.lengths[r] == 10 and not out.stopped[r]
            assert out.completions[r] == free.completions[r]
        else:
            assert out.lengths[r] == hit + 1 and out.stopped[r]
            assert out.completions[r] == free.completions[r][: hit + 1]  # stop token kept
            assert (out.tokens[r, hit + 1 :] == 255).all()  # padded after the stop
    assert first_hit[0] is not None and first_hit[0] <= 2


def test_generation_ends_when_all_rows_stop(llama):
    _, model = llama
    free = generate(model, PROMPTS[:1], max_new_tokens=8)
    out = generate(model, PROMPTS[:1], max_new_tokens=8, stop_tokens=[free.tokens[0, 0].item()])
    assert out.tokens.shape == (1, 1) and out.lengths.tolist() == [1]


def test_logprobs_match_reference_forward(llama):
    ref, model = llama
    out = generate(model, PROMPTS[:2], max_new_tokens=6, return_logprobs=True)
    for r, prompt in enumerate(PROMPTS[:2]):
        seq = torch.tensor([prompt + out.completions[r]])
        with torch.no_grad():
            logp = torch.log_softmax(ref(seq).logits[0].float(), dim=-1)  # [S,V]
        expected = logp[len(prompt) - 1 : -1].gather(-1, seq[0, len(prompt) :, None]).squeeze(-1)
        torch.testing.assert_close(out.logprobs[r], expected, atol=1e-4, rtol=0)


def test_sampling_seeded_and_within_filters(llama):
    _, model = llama
    a = generate(model, PROMPTS, max_new_tokens=8, temperature=0.9, top_k=20, seed=123)
    b = generate(model, PROMPTS, max_new_tokens=8, temperature=0.9, top_k=20, seed=123)
    c = generate(model, PROMPTS, max_new_tokens=8, temperature=0.9, top_k=20, seed=7)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    greedy = generate(model, PROMPTS, max_new_tokens=8)
    assert torch.equal(
        generate(model, PROMPTS, max_new_tokens=8, temperature=1.0, top_k=1, seed=1).tokens, greedy.tokens
    )
    assert torch.equal(
        generate(model, PROMPTS, max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=1).tokens, greedy.tokens
    )


def test_filter_logits_against_definitions():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]])
    kept = torch.isfinite(filter_logits(logits, top_k=2))
    assert kept.tolist() == [[True, False, False, False, True]]
    probs = torch.softmax(logits, -1)[0]  # sorted: idx 4 (.61), 0 (.22), 1 (.08), 2 (.05), 3 (.01)
    top_p = (probs[4] + probs[0]).item()  # exactly the mass of the two best tokens -> keep two
    assert torch.isfinite(filter_logits(logits, top_p=top_p - 1e-4)).tolist() == [
        [True, False, False, False, True]
    ]
    assert torch.isfinite(filter_logits(logits, top_p=top_p + 1e-4)).sum() == 3


def test_sampling_frequencies_follow_softmax():
    logits = torch.tensor([[1.0, 0.0, -0.5, 2.0]]).expand(20000, 4)
    g = torch.Generator().manual_seed(0)
    draws = sample_next_token(logits, temperature=0.8, generator=g)
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    torch.testing.assert_close(freq, torch.softmax(logits[0] / 0.8, -1), atol=0.015, rtol=0)


def test_bad_arguments_name_the_setting(llama):
    _, model = llama
    cases = [
        (dict(prompts=[[]], max_new_tokens=4), "prompts"),
        (dict(prompts=[[1]], max_new_tokens=0), "max_new_tokens"),
        (dict(prompts=[[1]], max_new_tokens=4, temperature=-1), "temperature"),
        (dict(prompts=[[1]], max_new_tokens=4, top_k=0), "top_k"),
        (dict(prompts=[[1]], max_new_tokens=4, top_p=1.5), "top_p"),
        (dict(prompts=[[1] * 60], max_new_tokens=10), "max_seq_len 64"),
    ]
    for kwargs, word in cases:
        prompts = kwargs.pop("prompts")
        with pytest.raises(GenerationError, match=word):
            generate(model, prompts, **kwargs)


def test_on_step_sees_every_token(llama):
    _, model = llama
    seen = []
    out = generate(
        model, PROMPTS, max_new_tokens=5, on_step=lambda t, running: seen.append((t.clone(), running.clone()))
    )
    assert torch.equal(torch.stack([t for t, _ in seen], dim=1), out.tokens)
    assert all(r.all() for _, r in seen)  # no stop tokens: every row runs every step


def test_forward_path_used_for_fsdp_models_gives_same_tokens(llama, monkeypatch):
    _, model = llama
    expected = generate(model, PROMPTS, max_new_tokens=6).tokens
    module = importlib.import_module("engine.generation.batched_generate")  # the module, not the function
    monkeypatch.setattr(module, "_is_fsdp", lambda m: True)  # FSDP2 models go through forward()
    assert torch.equal(generate(model, PROMPTS, max_new_tokens=6).tokens, expected)


def test_finished_rows_leave_the_batch(llama):
    """Rows stopping at different steps shrink the compute batch; the others' tokens do not change."""
    _, model = llama
    free = generate(model, PROMPTS, max_new_tokens=12)
    # Stop each row at its own step: row r stops at the token it produces at step 2r (first occurrence).
    stops = sorted({free.tokens[r, 2 * r].item() for r in range(len(PROMPTS))})
    widths = []
    out = generate(
        model,
        PROMPTS,
        max_new_tokens=12,
        stop_tokens=stops,
        on_step=lambda t, running: widths.append(int(running.sum())),
    )
    no_cache = generate(model, PROMPTS, max_new_tokens=12, stop_tokens=stops, use_cache=False)
    assert torch.equal(out.tokens, no_cache.tokens) and torch.equal(out.lengths, no_cache.lengths)
    for r, completion in enumerate(out.completions):
        assert completion == free.completions[r][: len(completion)]
        assert out.stopped[r] == (completion[-1] in stops)
    assert widths == sorted(widths, reverse=True) and widths[-1] < len(PROMPTS)


def test_repeated_prompts_are_prefilled_once(llama, monkeypatch):
    """GRPO groups repeat each prompt; the prefill runs on distinct prompts only, results unchanged."""
    _, model = llama
    group = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    expected = generate(model, group, max_new_tokens=8, use_cache=False)
    calls = []
    original = model.forward_hidden

    def recording(tokens, **kwargs):
        calls.append(tokens.shape)
        return original(tokens, **kwargs)

    monkeypatch.setattr(model, "forward_hidden", recording)
    out = generate(model, group, max_new_tokens=8)
    assert calls[0] == (2, len(PROMPTS[0]))  # prefill: 2 distinct prompts, not 5 rows
    assert calls[1][0] == 5  # decoding: every row
    assert torch.equal(out.tokens, expected.tokens)
    sampled = generate(model, group, max_new_tokens=8, temperature=1.0, seed=0)
    assert sampled.tokens.shape == (5, 8)
