"""Run under torchrun with 2 ranks (see test_parallelize.py): FSDP2 against one plain process,
on the real decoder (engine.models.llama3.llama3_tiny).

FSDP2 part: 2 ranks x 2 micro-batches, linear CE with token-normalised accumulation, activation
checkpointing, grad clipping, AdamW on DTensor shards, model built on meta and materialised from a full
state dict — versus one process, full batch, plain CE on materialised logits, torch clip_grad_norm_.
Optimizer-in-backward on FSDP2 shards versus one plain SGD process.
(Tensor, sequence, loss and context parallelism: parallel_worker.py.)
Prints `OK <json>` on rank 0; any mismatch raises and the rank exits 1.
"""

import functools
import json
import sys
import traceback

import torch
import torch.nn.functional as F

from engine.models.llama3 import llama3_tiny
from engine.modules.loss import LinearCrossEntropyLoss
from engine.training import (
    build_world_mesh,
    clip_grad_norm,
    count_step_tokens,
    init_distributed,
    materialize_model,
    parallelize,
    scale_for_step,
    setup_optimizer_in_backward,
    shutdown,
)


def tiny_decoder(seed=0):
    # The real decoder (engine.modules.TransformerDecoder), 2 layers, 64 dims, vocab 256, GQA 4/2 heads.
    torch.manual_seed(seed)
    return llama3_tiny()


VOCAB = 256

STEPS, MAX_NORM, LR = 3, 0.5, 0.5
# SGD with momentum (linear in the gradients): Adam divides by sqrt(v) and turns 1e-8 gradient noise on
# near-zero-gradient weights into visible steps, which would test Adam, not the sharding.
TOL = {"atol": 1e-5, "rtol": 1e-5}


def batches():
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (4, 12), generator=g)
        labels = torch.randint(0, VOCAB, (4, 12), generator=g)
        for row, n in enumerate([0, 5, 9, 3]):
            labels[row, :n] = -100
        out.append((tokens, labels))
    return out


def reference(clip=True):
    model = tiny_decoder(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses, norms = [], []
    for tokens, labels in batches():
        loss = F.cross_entropy(model(tokens).view(-1, VOCAB), labels.view(-1), ignore_index=-100)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM if clip else 1e9).item())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses, norms


def fsdp_run(info):
    mesh = build_world_mesh(info)
    with torch.device("meta"):
        model = llama3_tiny()
    parallelize(model, mesh=mesh, activation_checkpointing=True, fsdp=True)
    materialize_model(model, device=info.device, state_dict=tiny_decoder(seed=0).state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = LinearCrossEntropyLoss(chunk_size=8, reduction="sum")
    losses, norms = [], []
    for tokens, labels in batches():
        mine = slice(2 * info.rank, 2 * info.rank + 2)  # this rank's half of the global batch
        micro = [(tokens[mine][i : i + 1], labels[mine][i : i + 1]) for i in range(2)]
        total = count_step_tokens([lab for _, lab in micro])
        step_loss = torch.zeros(())
        for t, lab in micro:
            loss = scale_for_step(
                loss_fn(model.forward_hidden(t), model.output_weight, lab), total, info.world_size
            )
            loss.backward()
            step_loss += loss.detach()
        torch.distributed.all_reduce(step_loss)
        norms.append(clip_grad_norm(model.parameters(), MAX_NORM).item())
        opt.step()
        opt.zero_grad()
        losses.append(step_loss.item() / info.world_size)
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    # Plain forward (which itself calls the registered forward_hidden) under FSDP: same logits.
    tokens = batches()[0][0]
    with torch.no_grad():
        plain = tiny_decoder(seed=0)
        plain.load_state_dict(full)
        torch.testing.assert_close(model(tokens), plain(tokens), **TOL)
    return full, losses, norms


def fsdp_in_backward_run(info):
    """FSDP2 calls post-accumulate-grad hooks after its reduce-scatter: updates happen on the shards."""
    mesh = build_world_mesh(info)
    with torch.device("meta"):
        model = llama3_tiny()
    parallelize(model, mesh=mesh, fsdp=True)
    materialize_model(model, device=info.device, state_dict=tiny_decoder(seed=0).state_dict())
    opt = setup_optimizer_in_backward(model, functools.partial(torch.optim.SGD, lr=LR, momentum=0.9))
    loss_fn = LinearCrossEntropyLoss(chunk_size=8, reduction="sum")
    for tokens, labels in batches():
        mine = slice(2 * info.rank, 2 * info.rank + 2)
        total = count_step_tokens([labels[mine]])
        loss = loss_fn(model.forward_hidden(tokens[mine]), model.output_weight, labels[mine])
        scale_for_step(loss, total, info.world_size).backward()
        assert all(p.grad is None for p in model.parameters())  # freed right after each update
        opt.step()
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}


def main():
    info = init_distributed()
    assert info.world_size == 2, info
    ref_model, ref_losses, ref_norms = reference()
    full, losses, norms = fsdp_run(info)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), **TOL)
    assert set(full) == set(ref_model.state_dict())
    for key, value in ref_model.state_dict().items():
        torch.testing.assert_close(full[key], value, **TOL, msg=lambda m, k=key: f"{k}: {m}")
    ref_unclipped, _, _ = reference(clip=False)
    in_bwd = fsdp_in_backward_run(info)
    for key, value in ref_unclipped.state_dict().items():
        torch.testing.assert_close(in_bwd[key], value, **TOL, msg=lambda m, k=key: f"in-bwd {k}: {m}")
    if info.rank == 0:
        print("OK " + json.dumps({"losses": losses, "ref_losses": ref_losses, "grad_norms": norms}))


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        shutdown(1)
    shutdown(0)
