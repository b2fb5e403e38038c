"""Our lm-eval adapter against lm-eval's own `hf` backend (transformers) on the same checkpoint:
the multiple-choice task (per-choice log-likelihoods and accuracy), GSM8K generation (the exact
completions and exact-match), and rolling log-likelihood over several windows."""

from __future__ import annotations

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from engine.eval import TunebenchLM, evaluate  # noqa: E402
from engine.eval.runner import task_manager  # noqa: E402
from engine.eval.tasks import resolve_task_specs  # noqa: E402


def _hf(tiny_llama_dir, **extra):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=tiny_llama_dir, dtype="float32", device="cpu", batch_size=4, **extra)


def _reference(tiny_llama_dir, task, limit, **kwargs):
    return lm_eval.simple_evaluate(
        model=_hf(tiny_llama_dir),
        tasks=resolve_task_specs([task]),
        limit=limit,
        log_samples=True,
        bootstrap_iters=0,
        task_manager=task_manager((), include_defaults=False),
        **kwargs,
    )


def test_multiple_choice_scores_equal_hf_backend(tiny_llama_dir):
    ours = evaluate(
        TunebenchLM(pretrained=tiny_llama_dir, batch_size=3), "arith_mc", limit=12, log_samples=True
    )
    ref = _reference(tiny_llama_dir, "arith_mc", 12)
    ours_ll = torch.tensor([[r[0][0] for r in s["resps"]] for s in ours.samples["arith_mc"]])
    ref_ll = torch.tensor([[r[0][0] for r in s["resps"]] for s in ref["samples"]["arith_mc"]])
    assert ours_ll.shape == (12, 4)
    # Same weights, float32, different kernels and batch padding: log-likelihoods of ~-60 agree to 1e-4.
    torch.testing.assert_close(ours_ll, ref_ll, rtol=0, atol=1e-4)
    ours_greedy = [[r[0][1] for r in s["resps"]] for s in ours.samples["arith_mc"]]
    assert ours_greedy == [[r[0][1] for r in s["resps"]] for s in ref["samples"]["arith_mc"]]
    scores = {s.metric: s.value for s in ours.scores}
    assert scores["acc"] == ref["results"]["arith_mc"]["acc,none"]
    assert scores["acc_norm"] == ref["results"]["arith_mc"]["acc_norm,none"]
    assert ours.num_requests == 12 * 4


def test_gsm8k_generations_equal_hf_backend(tiny_llama_dir, real_assets):
    real_assets("configs/eval/tasks/gsm8k_local.yaml reads ../shared/assets/data/gsm8k_test.jsonl")
    gen = {"max_gen_toks": 24}
    ours = evaluate(
        TunebenchLM(pretrained=tiny_llama_dir, batch_size=3),
        "gsm8k_local",
        limit=4,
        gen_kwargs=gen,
        log_samples=True,
    )
    ref = _reference(tiny_llama_dir, "gsm8k_local", 4, gen_kwargs=gen)
    ours_text = [s["resps"][0][0] for s in ours.samples["gsm8k_local"]]
    ref_text = [s["resps"][0][0] for s in ref["samples"]["gsm8k_local"]]
    assert ours_text == ref_text
    assert any(len(t) > 20 for t in ours_text)  # real completions, not empty strings
    scores = {s.metric: s.value for s in ours.scores}
    for metric in ("exact_match,strict-match", "exact_match,flexible-extract"):
        assert scores[metric] == ref["results"]["gsm8k_local"][metric]


def test_generation_stops_at_until_strings_like_hf(tiny_llama_dir):
    """Stop strings the random model does produce: rows end early and are cut like the hf backend's."""
    from lm_eval.api.instance import Instance

    ours, ref = TunebenchLM(pretrained=tiny_llama_dir, batch_size=4), _hf(tiny_llama_dir)
    probe = ours.generate_until(
        [
            Instance(
                "generate_until",
                {},
                ("Question: what is 2+2?\nAnswer:", {"until": [], "max_gen_toks": 12}),
                0,
            )
        ],
        disable_tqdm=True,
    )[0]
    stop = probe[4:7]  # a piece of text the model does generate
    assert stop.strip()
    requests = [
        Instance("generate_until", {}, (ctx, {"until": [stop], "max_gen_toks": 12}), i)
        for i, ctx in enumerate(["Question: what is 2+2?\nAnswer:", "Hello", "The capital of France is"])
    ]
    got = ours.generate_until(requests, disable_tqdm=True)
    assert got == ref.generate_until(requests, disable_tqdm=True)
    assert stop not in got[0] and len(got[0]) < len(probe)


def test_rolling_loglikelihood_equals_hf_backend_over_windows(tiny_llama_dir):
    from lm_eval.api.instance import Instance

    texts = [
        "The quick brown fox jumps over the lazy dog. " * 8,
        "A short one.",
        "Numbers: " + " ".join(str(i) for i in range(40)),
    ]
    requests = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    ours = TunebenchLM(pretrained=tiny_llama_dir, batch_size=4, max_length=32)  # several windows per text
    ref = _hf(tiny_llama_dir, max_length=32)
    assert len(ours.tok_encode(texts[0])) > 2 * 32
    torch.testing.assert_close(
        torch.tensor(ours.loglikelihood_rolling(requests, disable_tqdm=True)),
        torch.tensor(ref.loglikelihood_rolling(requests, disable_tqdm=True)),
        rtol=0,
        atol=1e-3,
    )


def test_tokenization_and_chat_template_match_hf_backend(tiny_llama_dir):
    ours, ref = TunebenchLM(pretrained=tiny_llama_dir), _hf(tiny_llama_dir)
    for text in ["Question: 3+4?\nAnswer:", "<|begin_of_text|>already has BOS", " leading space"]:
        assert ours.tok_encode(text) == ref.tok_encode(text)  # BOS added once, never doubled
        assert ours.tok_encode(text, add_special_tokens=False) == ref.tok_encode(
            text, add_special_tokens=False
        )
    assert ours.prefix_token_id == ref.prefix_token_id and ours.eot_token_id == ref.eot_token_id
    assert ours.max_length == ref.max_length == 512
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    assert ours.apply_chat_template(chat) == ref.apply_chat_template(chat)
    prefill = chat + [{"role": "assistant", "content": "The answer is"}]
    assert ours.apply_chat_template(prefill, add_generation_prompt=False) == ref.apply_chat_template(
        prefill, add_generation_prompt=False
    )


def test_chat_template_runs_equal_hf_backend(tiny_llama_dir, real_assets):
    """`apply_chat_template=True`: prompts rendered with the Llama-3 template on both backends give
    the same log-likelihoods and the same generations."""
    real_assets("it renders the real Llama 3 chat template and gsm8k_local reads ../shared's GSM8K rows")
    gen = {"max_gen_toks": 12}
    ours = evaluate(
        TunebenchLM(pretrained=tiny_llama_dir, batch_size=4),
        ["arith_mc", "gsm8k_local"],
        limit=3,
        gen_kwargs=gen,
        apply_chat_template=True,
        log_samples=True,
    )
    ref = _reference(tiny_llama_dir, "arith_mc", 3, apply_chat_template=True)
    ref_gen = _reference(tiny_llama_dir, "gsm8k_local", 3, apply_chat_template=True, gen_kwargs=gen)
    first = ours.samples["arith_mc"][0]["arguments"][0][0]
    assert first.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert first == ref["samples"]["arith_mc"][0]["arguments"][0][0]
    torch.testing.assert_close(
        torch.tensor([[r[0][0] for r in s["resps"]] for s in ours.samples["arith_mc"]]),
        torch.tensor([[r[0][0] for r in s["resps"]] for s in ref["samples"]["arith_mc"]]),
        rtol=0,
        atol=1e-4,
    )
    assert [s["resps"][0][0] for s in ours.samples["gsm8k_local"]] == [
        s["resps"][0][0] for s in ref_gen["samples"]["gsm8k_local"]
    ]


def test_in_memory_model_equals_folder(tiny_llama_dir):
    """`TunebenchLM(model=..., tokenizer=...)` (evaluating a model a recipe holds) scores as the folder."""
    from lm_eval.api.instance import Instance

    from engine.data.tokenizers import load_tokenizer
    from engine.models import from_pretrained

    requests = [Instance("loglikelihood", {}, ("Question: 2 plus 2?\nAnswer:", f" {i}"), i) for i in range(4)]
    folder = TunebenchLM(pretrained=tiny_llama_dir).loglikelihood(requests, disable_tqdm=True)
    in_memory = TunebenchLM(
        model=from_pretrained(tiny_llama_dir, dtype=torch.float32), tokenizer=load_tokenizer(tiny_llama_dir)
    )
    assert in_memory.max_length == 512
    torch.testing.assert_close(
        torch.tensor([s for s, _ in in_memory.loglikelihood(requests, disable_tqdm=True)]),
        torch.tensor([s for s, _ in folder]),
        rtol=0,
        atol=1e-5,
    )
