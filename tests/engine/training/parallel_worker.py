"""Run under torchrun with 2 gloo ranks (see test_parallel_modes.py): each parallel mode of one mesh
against one plain process on the same weights and batches.

`python -m tests.engine.training.parallel_worker MODE...`, modes:
  tp     TP + sequence parallel + loss parallel (untied output, vocab-sharded logits), FSDP2 on top
  tied   TP + sequence parallel with a tied embedding (replicated, linear cross-entropy)
  lora   LoRA on every projection and the output under TP (adapters sharded as their base)
  qlora  QLoRA (NF4 base, kept replicated) under TP
  qlorafsdp  QLoRA under FSDP2 (dp_shard=2): NF4 bases sharded where they split evenly, else whole
  qlorahsdp, qloracp  (4 ranks) the same under dp_replicate=2 x dp_shard=2, dp_replicate=2 x cp=2
  dora   DoRA under TP
  cp     context parallel 2 ranks, ring attention, packed documents
  cpcompile  the same with every block compiled (the ring eager between graphs)
  hsdp   HSDP 2 x 1 (replicate over 2, shard over 1)
  tpresume, cpresume  tp=2 / cp=2 stopped after step 1, resumed from the recipes' checkpoint
  tpcp   (4 ranks) tp=2 x cp=2 on packed documents
  cphsdp, cpfsdp  (4 ranks) dp_replicate=2 x cp=2, dp_shard=2 x cp=2 on packed documents
Per-step losses and final weights must match the plain run (SGD with momentum, linear in the gradients,
so the comparison tests the parallelism, not Adam's amplification of 1e-8 noise). Prints `OK <mode>
<json>` per mode on rank 0; any mismatch raises and the rank exits 1.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch
import torch.distributed as dist

from engine.models.llama3 import SIZES, llama3, lora_llama3
from engine.modules.loss import LinearCrossEntropyLoss
from engine.training import (
    build_world_mesh,
    clip_grad_norm,
    init_distributed,
    materialize_model,
    parallelize,
    shutdown,
    token_losses,
)
from engine.training.context_parallel import split_batch
from engine.training.device_mesh import ParallelDims

VOCAB = 256
STEPS, LR, MAX_NORM = 3, 0.5, 1.0
TOL = {"atol": 2e-5, "rtol": 2e-5}
LORA = dict(
    lora_attn_modules=("q_proj", "k_proj", "v_proj", "output_proj"), apply_lora_to_mlp=True, lora_rank=4
)


def build(kind: str, seed: int = 0) -> torch.nn.Module:
    sizes = dict(SIZES["llama3_tiny"])
    torch.manual_seed(seed)
    if kind == "tied":
        return llama3(**sizes, tie_word_embeddings=True)
    if kind == "qlorafsdp":  # 128 wide: the MLP's NF4 bases split over 2 shards, the attention's do not
        sizes.update(embed_dim=128, intermediate_dim=256)
    if kind in ("lora", "qlora", "dora", "qlorafsdp"):
        model = lora_llama3(
            **sizes,
            **LORA,
            apply_lora_to_output=kind == "lora",
            quantize_base=kind in ("qlora", "qlorafsdp"),
            use_dora=kind == "dora",
        )
        with torch.no_grad():  # B = 0 at init would leave half the adapter math untested
            for name, p in model.named_parameters():
                if name.endswith("lora_b.weight"):
                    p.normal_(0, 0.05)
                if name.endswith("magnitude"):
                    p.mul_(1.1)
        for name, p in model.named_parameters():
            p.requires_grad_(name.endswith(("lora_a.weight", "lora_b.weight", "magnitude")))
        return model
    return llama3(**sizes)


def batches(seq: int = 16, packed: bool = False, rows: int = 2):
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (rows, seq), generator=g)
        labels = torch.randint(0, VOCAB, (rows, seq), generator=g)
        labels[0, :3] = -100
        labels[1, 5:9] = -100
        batch = {"tokens": tokens, "labels": labels}
        if packed:  # row 0: documents of 5, 7, 4 tokens; row 1: 10, 6
            doc = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [0] * 10 + [1] * 6])
            pos = torch.cat([torch.arange(n) for n in (5, 7, 4)] + [torch.arange(n) for n in (10, 6)]).view(
                2, seq
            )
            batch.update(document_ids=doc, position_ids=pos)
        out.append(batch)
    return out


def step_loss(model, batch, *, linear_ce: bool = False) -> torch.Tensor:
    """Sum of token losses of the batch (plain CE on one rank, vocab-parallel CE on a sharded output)."""
    kw = {k: batch[k] for k in ("position_ids", "document_ids") if k in batch}
    if linear_ce:
        return LinearCrossEntropyLoss(chunk_size=8, reduction="sum")(
            model.forward_hidden(batch["tokens"], **kw), model.output_weight, batch["labels"]
        )
    return token_losses(model(batch["tokens"], **kw), batch["labels"]).sum()


def sgd(model) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=0.9)


def train(model, data, *, linear_ce=False, local=None, scale=1.0, copies=1, opt=None):
    """SGD steps (with `opt`, or a new optimizer); `local(batch)` is this rank's share of a batch (its
    loss sum is all-reduced over the world, where `copies` ranks hold each token: tp), `scale` undoes
    FSDP's gradient average."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = opt or sgd(model)
    losses, norms = [], []
    for batch in data:
        total = (batch["labels"] != -100).sum().item()  # the global batch's loss tokens
        loss = step_loss(model, local(batch) if local else batch, linear_ce=linear_ce)
        (loss * scale / total).backward()
        summed = loss.detach().clone()
        if local:
            dist.all_reduce(summed)
            summed /= copies
        norms.append(clip_grad_norm(params, MAX_NORM).item())
        opt.step()
        opt.zero_grad()
        losses.append(summed.item() / total)
    return losses, norms


def full_state(model) -> dict[str, torch.Tensor]:
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach()
        for k, v in model.state_dict().items()
    }


def compare(mode, ref, got, losses, ref_losses, norms, ref_norms):
    for key, value in ref.items():
        g = got[key]
        if hasattr(value, "get_original_weight"):  # NF4 bases: frozen, compare dequantised
            value, g = value.get_original_weight(), g.get_original_weight()
        torch.testing.assert_close(g, value, **TOL, msg=lambda m, k=key: f"{mode} {k}: {m}")
    torch.testing.assert_close(
        torch.tensor(losses), torch.tensor(ref_losses), **TOL, msg=lambda m: f"{mode} losses: {m}"
    )
    torch.testing.assert_close(
        torch.tensor(norms), torch.tensor(ref_norms), **TOL, msg=lambda m: f"{mode} norms: {m}"
    )


def run_tp(info, kind: str):
    """tp=2 (+ SP + loss parallel); FSDP2 over the dp_shard=1 dimension on top for the plain models."""
    linear_ce = kind == "tied"
    ref_model = build(kind)
    ref_losses, ref_norms = train(ref_model, batches(), linear_ce=linear_ce)
    mesh = build_world_mesh(info, ParallelDims(dp_shard=1, tp=2))
    fsdp = kind != "qlora"  # NF4 under FSDP2 is not part of this test
    if fsdp:
        with torch.device("meta"):
            model = build(kind)
        parallelize(model, mesh=mesh, fsdp=True, activation_checkpointing=kind == "lora")
        materialize_model(model, device="cpu", state_dict=build(kind).state_dict())
    else:
        model = build(kind)
        parallelize(model, mesh=mesh, fsdp=False)
    seen = []  # sequence parallel: the residual stream between blocks is [B, S/tp, D] on each rank
    hook = model.layers[0].register_forward_hook(lambda _m, _i, out: seen.append(tuple(out.shape)))
    losses, norms = train(model, batches(), linear_ce=linear_ce)
    hook.remove()
    assert seen[0] == (2, 8, 64), seen
    compare(kind, ref_model.state_dict(), full_state(model), losses, ref_losses, norms, ref_norms)
    if kind == "tp":  # loss parallel: the logits stay sharded on the vocabulary
        with torch.no_grad():
            logits = model(batches()[0]["tokens"])
        assert logits.placements[-1].is_shard(dim=2) and logits.to_local().shape[-1] == VOCAB // 2, (
            logits.placements
        )
    return {"losses": losses, "ref_losses": ref_losses}


def run_cp(info, kind: str):
    """cp=2: each rank its load-balanced half of every sequence, ring attention; FSDP2 over the
    flattened dp_shard x cp dimension. Steps 0 and 2 are packed (3 and 2 documents per row), step 1 not.
    `cpcompile`: the same with every block `torch.compile`d (the ring runs eagerly between graphs).
    `cphsdp` / `cpfsdp` (4 ranks): dp_replicate=2 x cp=2 / dp_shard=2 x cp=2, one row per dp rank."""
    data = batches(seq=16, packed=True)
    data[1] = {k: data[1][k] for k in ("tokens", "labels")}
    ref_model = build("tp")
    ref_losses, ref_norms = train(ref_model, data)
    dims = {
        "cphsdp": ParallelDims(dp_replicate=2, dp_shard=1, cp=2),
        "cpfsdp": ParallelDims(dp_shard=2, cp=2),
    }
    dims = dims.get(kind, ParallelDims(dp_shard=1, cp=2))
    mesh = build_world_mesh(info, dims)
    with torch.device("meta"):
        model = build("tp")
    parallelize(
        model, mesh=mesh, fsdp=True, activation_checkpointing=kind == "cp", compile=kind == "cpcompile"
    )
    materialize_model(model, device="cpu", state_dict=build("tp").state_dict())
    if kind == "cphsdp":
        assert model.tok_embeddings.weight.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard_cp")
    rank = mesh["cp"].get_local_rank()
    row = slice(dims.dp_rank(info.rank), dims.dp_rank(info.rank) + 1) if dims.dp > 1 else slice(None)
    seen, traced = [], []
    hook = model.layers[0].register_forward_hook(lambda _m, _i, out: seen.append(tuple(out.shape)))
    # Inside a compiled block this hook runs while dynamo traces it (is_compiling() is True then).
    inner = model.layers[0].mlp.register_forward_hook(lambda *_: traced.append(torch.compiler.is_compiling()))
    local = lambda b: split_batch({k: v[row] for k, v in b.items()}, 2, rank, pad_id=0)  # noqa: E731
    losses, norms = train(model, data, local=local, scale=float(dims.dp * dims.cp))
    hook.remove()
    inner.remove()
    assert seen[0] == (2 // dims.dp, 8, 64), seen  # each rank holds half of each sequence (of its rows)
    assert any(traced) == (kind == "cpcompile"), traced
    compare(kind, ref_model.state_dict(), full_state(model), losses, ref_losses, norms, ref_norms)
    return {"losses": losses, "ref_losses": ref_losses}


def run_hsdp(info, kind: str):
    """HSDP 2 x 1: parameters replicated over dp_replicate=2 (sharded over dp_shard=1), one row each."""
    ref_model = build("tp")
    ref_losses, ref_norms = train(ref_model, batches())
    mesh = build_world_mesh(info, ParallelDims(dp_replicate=2, dp_shard=1))
    with torch.device("meta"):
        model = build("tp")
    parallelize(model, mesh=mesh, fsdp=True)
    assert model.tok_embeddings.weight.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard")
    materialize_model(model, device="cpu", state_dict=build("tp").state_dict())
    mine = slice(info.rank, info.rank + 1)
    losses, norms = train(model, batches(), local=lambda b: {k: v[mine] for k, v in b.items()}, scale=2.0)
    compare(kind, ref_model.state_dict(), full_state(model), losses, ref_losses, norms, ref_norms)
    return {"losses": losses, "ref_losses": ref_losses}


def run_qlora_fsdp(info, kind: str):
    """QLoRA under FSDP2 over 2 shards, one row per data-parallel rank: every rank builds the whole NF4
    model (same seed), FSDP2 shards the NF4 bases that split into whole blocks and scaler groups (the
    MLP's) and keeps the others (the attention's: one scaler group each) whole; adapters sharded as
    usual. `qlorafsdp`: dp_shard=2; 4 ranks: `qlorahsdp` dp_replicate=2 x dp_shard=2 (4 rows),
    `qloracp` dp_replicate=2 x cp=2 (FSDP2 over the cp ranks; each row split over them)."""
    from torch.distributed.tensor import DTensor

    from engine.modules.peft.lora import is_nf4

    dims = {
        "qlorafsdp": ParallelDims(dp_shard=2),
        "qlorahsdp": ParallelDims(dp_replicate=2, dp_shard=2),
        "qloracp": ParallelDims(dp_replicate=2, dp_shard=1, cp=2),
    }[kind]
    data = batches(rows=max(2, dims.dp))
    ref_model = build("qlorafsdp")
    ref_losses, ref_norms = train(ref_model, data)
    mesh = build_world_mesh(info, dims)
    model = build("qlorafsdp")
    parallelize(model, mesh=mesh, fsdp=True, activation_checkpointing=True)
    block = model.layers[0]
    sharded, whole = block.mlp.gate_proj.weight, block.attn.q_proj.weight
    assert isinstance(sharded, DTensor) and is_nf4(sharded.to_local()), type(sharded)
    assert sharded.to_local().shape == (128, 128), sharded.to_local().shape  # half of [256, 128]
    assert not isinstance(whole, DTensor) and is_nf4(whole), type(whole)
    assert isinstance(block.attn.q_proj.lora_a.weight, DTensor)
    dp_rank, cp_rank = dims.dp_rank(info.rank), mesh["cp"].get_local_rank()
    rows = data[0]["tokens"].shape[0] // dims.dp
    mine = slice(dp_rank * rows, (dp_rank + 1) * rows)

    def local(b):
        b = {k: v[mine] for k, v in b.items()}
        return split_batch(b, dims.cp, cp_rank, pad_id=0) if dims.cp > 1 else b

    losses, norms = train(model, data, local=local, scale=float(dims.dp * dims.cp))
    compare(kind, ref_model.state_dict(), full_state(model), losses, ref_losses, norms, ref_norms)
    return {"losses": losses, "ref_losses": ref_losses}


def run_resume(info, kind: str):
    """Stopped after step 1 and resumed (`tpresume`: tp=2 + SP + loss parallel; `cpresume`: cp=2 on
    packed documents; FSDP2 on top): the recipes' checkpoint (`save_checkpoint`, DCP: each rank writes
    its own TP/FSDP2 shards of the weights and the SGD momentum) is loaded into a fresh model built
    from other weights and a fresh optimizer, which run steps 2-3: equal to the uninterrupted run."""
    import shutil
    import tempfile

    from engine.checkpoint.recipe_state import load_checkpoint, save_checkpoint

    cp = kind == "cpresume"
    data = batches(packed=cp)
    ref_model = build("tp")
    ref_losses, ref_norms = train(ref_model, data)
    mesh = build_world_mesh(info, ParallelDims(dp_shard=1, cp=2) if cp else ParallelDims(dp_shard=1, tp=2))
    rank = mesh["cp"].get_local_rank()
    kw = {"local": lambda b: split_batch(b, 2, rank, pad_id=0), "scale": 2.0} if cp else {}

    def fresh(seed: int):
        with torch.device("meta"):
            model = build("tp")
        parallelize(model, mesh=mesh, fsdp=True)
        materialize_model(model, device="cpu", state_dict=build("tp", seed=seed).state_dict())
        return model, sgd(model)

    folder = [tempfile.mkdtemp(prefix="resume_") if info.rank == 0 else None]
    dist.broadcast_object_list(folder)
    try:
        model, opt = fresh(0)
        losses, norms = train(model, data[:1], opt=opt, **kw)
        path = save_checkpoint(folder[0], 1, model=model, optimizer=opt, recipe_state={"next_batch": 1})
        del model, opt
        model, opt = fresh(1)  # other weights, no momentum: the checkpoint must bring both back
        state = load_checkpoint(path, model=model, optimizer=opt)
        assert state == {"next_batch": 1, "step": 1}, state
        more_losses, more_norms = train(model, data[state["next_batch"] :], opt=opt, **kw)
        losses, norms = losses + more_losses, norms + more_norms
        compare(kind, ref_model.state_dict(), full_state(model), losses, ref_losses, norms, ref_norms)
    finally:
        dist.barrier()
        if info.rank == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
    return {"losses": losses, "ref_losses": ref_losses}


def run_tp_cp(info, kind: str):
    """4 ranks, tp=2 x cp=2: each cp rank its half of every (packed) sequence, each tp rank a quarter
    of that half's residual stream, the output vocab-sharded; FSDP2 over dp_shard x cp."""
    ref_model = build("tp")
    ref_losses, ref_norms = train(ref_model, batches(packed=True))
    mesh = build_world_mesh(info, ParallelDims(dp_shard=1, cp=2, tp=2))
    with torch.device("meta"):
        model = build("tp")
    parallelize(model, mesh=mesh, fsdp=True)
    materialize_model(model, device="cpu", state_dict=build("tp").state_dict())
    rank = mesh["cp"].get_local_rank()
    seen = []
    hook = model.layers[0].register_forward_hook(lambda _m, _i, out: seen.append(tuple(out.shape)))
    local = lambda b: split_batch(b, 2, rank, pad_id=0, multiple=2)  # noqa: E731
    losses, norms = train(model, batches(packed=True), local=local, scale=2.0, copies=2)
    hook.remove()
    assert seen[0] == (2, 4, 64), seen
    compare(kind, ref_model.state_dict(), full_state(model), losses, ref_losses, norms, ref_norms)
    return {"losses": losses, "ref_losses": ref_losses}


FOUR_RANKS = {"tpcp", "cphsdp", "cpfsdp", "qlorahsdp", "qloracp"}
MODES = {
    "tp": run_tp,
    "tied": run_tp,
    "lora": run_tp,
    "qlora": run_tp,
    "dora": run_tp,
    "cp": run_cp,
    "cpcompile": run_cp,
    "cphsdp": run_cp,
    "cpfsdp": run_cp,
    "hsdp": run_hsdp,
    "qlorafsdp": run_qlora_fsdp,
    "qlorahsdp": run_qlora_fsdp,
    "qloracp": run_qlora_fsdp,
    "tpresume": run_resume,
    "cpresume": run_resume,
    "tpcp": run_tp_cp,
}


def main(modes: list[str]) -> None:
    info = init_distributed()
    assert info.world_size == (4 if set(modes) <= FOUR_RANKS else 2), info
    torch.set_num_threads(1)
    for mode in modes:
        result = MODES[mode](info, mode)
        if info.rank == 0:
            print(f"OK {mode} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        shutdown(1)
    shutdown(0)
