"""KTO on unpaired desirable/undesirable data through the DPO recipe (tiny Llama, CPU): the loss of
an unpaired micro-batch equals the paper's formula computed by hand (each row scored alone, the KL
rows built by hand), and a short run on unpaired digit data ranks held-out pairs well where ignoring
the labels would not."""

from __future__ import annotations

import math

import pytest
import torch

from engine.config import ConfigError
from tests.engine.recipes._recipe_runner import train_in_process

TINY = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 16, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64,
    "intermediate_dim": 128, "max_seq_len": 32, "rope_base": 10000.0,
}  # fmt: skip
KTO = {"_component_": "engine.modules.loss.KTOLoss", "beta": 0.5, "desirable_weight": 1.0,
       "undesirable_weight": 1.25}  # fmt: skip


def config(out, **over):
    cfg = {
        "output_dir": str(out), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": dict(TINY), "tokenizer": {"_component_": "engine.rl.toy_task.DigitTokenizer"},
        "dataset": {"_component_": "engine.rl.toy_preferences.digit_unpaired_dataset", "n": 960, "distractors": 1},
        "batch_size": 16, "gradient_accumulation_steps": 1, "epochs": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.0},
        "loss": dict(KTO), "save_every_n_steps": None, "keep_last_n_checkpoints": 1,
    }  # fmt: skip
    cfg.update(over)
    return cfg


def make(cfg, *, train: bool):
    from engine.recipes.dpo import DPORecipe, check_config

    return train_in_process(DPORecipe, check_config, cfg, train=train)


def _completion_logp(model, prompt: list[int], completion: list[int]) -> float:
    """log p(completion | prompt), one unpadded row, straight from the logits."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion]))[0].double()  # [S,V]
    logp = torch.log_softmax(logits, -1)
    return sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(completion))


def test_unpaired_kto_loss_matches_the_paper_by_hand(tmp_path):
    from engine.data.unpaired import padded_collate_unpaired

    recipe = make(config(tmp_path), train=False)
    torch.manual_seed(4)  # a seed whose KL estimate is positive (seeds 1-3 clamp it to 0)
    with torch.no_grad():  # move the policy off the reference so rewards and z0 are not all zero
        for p in recipe.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ds = recipe.loader.dataset
    good = [i for i in range(len(ds)) if ds[i]["desirable"]][:3]
    bad = [i for i in range(len(ds)) if not ds[i]["desirable"]][:2]
    samples = [ds[i] for i in good[:2] + bad + good[2:]]  # mixed labels: D D U U D
    batch = padded_collate_unpaired(samples, pad_id=recipe.tokenizer.pad_id)
    losses, stats, z0, _ = recipe._unpaired_micro_batch(batch)

    # split each row by hand: the completion is where labels are set (labels[t] = tokens[t+1])
    parts = []
    for s in samples:
        start = next(t for t, v in enumerate(s["labels"]) if v != -100) + 1
        parts.append((s["tokens"][:start], s["tokens"][start:]))
    n, beta, lam_d, lam_u = len(samples), 0.5, 1.0, 1.25
    r = [_completion_logp(recipe.model, p, c) - _completion_logp(recipe.reference, p, c) for p, c in parts]
    # Ethayarajh et al. 2024 §4: z0 = max(0, mean KL over mismatched (x_i, y_{i+1})), no gradient
    kl = [
        _completion_logp(recipe.model, parts[i][0], parts[(i + 1) % n][1])
        - _completion_logp(recipe.reference, parts[i][0], parts[(i + 1) % n][1])
        for i in range(n)
    ]
    z = max(0.0, sum(kl) / n)
    assert z > 0  # the clamp does not hide the estimate here
    torch.testing.assert_close(z0, z, rtol=1e-4, atol=1e-5)
    for i, s in enumerate(samples):
        sig = 1 / (1 + math.exp(-beta * ((r[i] - z) if s["desirable"] else (z - r[i]))))
        want = lam_d * (1 - sig) if s["desirable"] else lam_u * (1 - sig)
        torch.testing.assert_close(losses[i].item(), want, rtol=1e-4, atol=1e-6)
    rd, ru = (
        [beta * r[i] for i in range(n) if samples[i]["desirable"]],
        [beta * r[i] for i in range(n) if not samples[i]["desirable"]],
    )
    assert stats[8].item() == 3 and stats[9].item() == 2 and stats[10].item() == 6
    assert stats[4].item() == sum(a > b for a in rd for b in ru)
    torch.testing.assert_close(stats[2].item(), sum(rd), rtol=1e-4, atol=1e-5)


def test_unpaired_kto_run_ranks_heldout_pairs(tmp_path):
    # ~15 s on 2 loaded cores: 60 steps of 16 unpaired examples, each prompt seen once with one label.
    # 30% desirable (the right digit X+1), 70% one tempting mistake (X+2): likelihood on every completion
    # (labels ignored) would rank the mistake first (0.22 held-out when written); KTO must not.
    import random

    from engine.training.logprobs import token_logprobs

    cfg = config(tmp_path)
    cfg["dataset"].update(desirable_share=0.3, wrong_offset=1)
    cfg["loss"].update(desirable_weight=2.33, undesirable_weight=1.0)  # lambda_D n_D / (lambda_U n_U) = 1
    recipe = make(cfg, train=True)
    h = recipe.history
    assert len(h) == 60 and all(math.isfinite(x["loss"]) and x["kl"] >= 0 for x in h)
    first = sum(x["rewards/accuracy"] for x in h[:5]) / 5
    last = sum(x["rewards/accuracy"] for x in h[-5:]) / 5
    # desirable reward > undesirable, in batch: 0.28 -> 0.97 when written
    assert last >= first + 0.3 and last >= 0.8, (first, last)

    # held-out pairs: the right digit vs the tempting mistake, implicit rewards; 0.96 when written
    rnd, tok, hits = random.Random(7), recipe.tokenizer, 0
    for _ in range(200):
        digits = [rnd.randrange(10) for _ in range(2)]
        prompt = tok.encode("".join(map(str, digits)) + ">", add_bos=True, add_eos=False)
        rows = []
        for answer in ((digits[0] + 1) % 10, (digits[0] + 2) % 10):
            c = tok.encode(str(answer), add_bos=False, add_eos=True)
            rows.append((prompt + c, [-100] * (len(prompt) - 1) + c + [-100]))
        toks, labs = torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])
        with torch.no_grad():
            margin = token_logprobs(recipe.model, toks, labs).sum(1) - token_logprobs(
                recipe.reference, toks, labs
            ).sum(1)
        hits += int(margin[0] > margin[1])
    assert hits / 200 >= 0.85, hits / 200


def test_unpaired_data_needs_kto(tmp_path):
    with pytest.raises(ConfigError, match="unpaired data .* needs loss KTOLoss"):
        make(config(tmp_path, loss={"_component_": "engine.modules.loss.DPOLoss"}), train=False)
    with pytest.raises(ConfigError, match=">= 2 examples per micro-batch"):
        make(config(tmp_path, batch_size=1), train=False)
