"""Normalised IPO (`DPOLoss(loss_type="ipo", ipo_normalize=True)`) equals TRL's IPO on the same inputs.

The reference is TRL itself (installed, `trl` in the dev extras): a real `trl.DPOTrainer` with
`loss_type=["ipo"]` computes its loss (`compute_loss`, public) on a collated batch of two preference pairs,
with a tiny Hugging Face Llama as the policy and a differently initialised one as the reference. The
same batch's summed response log-probs, taken from each model's logits by hand, go through our loss:

    L = mean_pairs ((logp_c - ref_c) / |y_c| - (logp_r - ref_r) / |y_r| - 1 / (2 beta))^2

(|y| the response's token count). The summed form (`ipo_normalize=False`) differs from TRL's there.
"""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

WORDS = "<pad> <eos> <unk> the sky is blue green two plus makes four five hundred today".split()


def _tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _response_logps(model, batch) -> torch.Tensor:
    """Summed log-probs of the completion tokens, `[2B]` (TRL's batch: chosen rows, then rejected)."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    target = batch["input_ids"][:, 1:]
    mask = batch["completion_mask"][:, 1:].bool()
    return (logp.gather(-1, target.unsqueeze(-1)).squeeze(-1) * mask).sum(1)


def test_normalised_ipo_equals_trl(tmp_path):
    from engine.modules.loss import DPOLoss

    tok = _tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    policy = transformers.LlamaForCausalLM(cfg)
    torch.manual_seed(1)
    reference = transformers.LlamaForCausalLM(cfg)
    rows = datasets.Dataset.from_dict(
        {
            "prompt": ["two plus two makes", "the sky is"],
            "chosen": [" four", " blue today"],
            "rejected": [" five hundred five", " green"],
        }
    )  # fmt: skip  (responses of 1-4 tokens + eos: the lengths differ within and across pairs)
    beta = 0.1
    args = trl.DPOConfig(
        output_dir=str(tmp_path), loss_type=["ipo"], beta=beta, per_device_train_batch_size=2,
        report_to=[], use_cpu=True, max_length=None,
    )  # fmt: skip
    trainer = trl.DPOTrainer(
        model=policy, ref_model=reference, args=args, train_dataset=rows, processing_class=tok
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    want = trainer.compute_loss(trainer.model, batch).detach().double()

    pol, ref = _response_logps(policy, batch), _response_logps(reference, batch)
    lengths = batch["completion_mask"].sum(1)
    assert len(set(lengths.tolist())) > 1  # normalising matters on these rows
    ours = DPOLoss(beta=beta, loss_type="ipo")  # ipo_normalize defaults to True
    losses, _, _ = ours(pol[:2], pol[2:], ref[:2], ref[2:], lengths[:2], lengths[2:])
    # fp32 models: TRL's log-probs are float32 sums, ours are float64 from the same logits
    torch.testing.assert_close(losses.double().mean(), want, rtol=1e-4, atol=1e-5)

    summed, _, _ = DPOLoss(beta=beta, loss_type="ipo", ipo_normalize=False)(
        pol[:2], pol[2:], ref[:2], ref[2:]
    )
    assert abs(summed.double().mean().item() - want.item()) > 1e-2  # the old form is not TRL's
