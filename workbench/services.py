"""The workbench's calls into the tracker readers, the launcher and engine.config, in one place.

Every function here blocks (SQLite, files, subprocesses) and is meant to run in a worker thread:
each call opens its own short-lived database connection. Return values are plain dicts/lists so
screens never hold a database handle.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from workbench.errors import UserError


def _db():
    from engine.tracking.db import open_db

    return open_db()


def run_row(summary: Any) -> dict[str, Any]:
    """A `RunSummary` as the row the runs table shows (keys of `workbench.widgets.runs_table.COLUMNS`)."""
    run = summary.run
    started = run.started_at or run.created_at
    end = run.ended_at or (time.time() if run.status == "running" else None)
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "recipe": run.recipe,
        "model": run.model,
        "last_loss": summary.last_loss,
        "tokens_per_sec": summary.tokens_per_sec_median,
        "mem_peak_gb": summary.mem_peak_gb,
        "started": started,
        "duration": (end - run.started_at) if (end and run.started_at) else None,
        "parent": run.parent_id,
        "step": run.step,
        "total_steps": run.total_steps,
        "tags": run.tags,
        "notes": run.notes,
        "eta_s": summary.eta_s,
    }


def list_runs() -> list[dict[str, Any]]:
    """All runs, newest first, as table rows."""
    from engine.tracking import readers

    with _db() as db:
        return [run_row(s) for s in readers.list_summaries(db=db)]


def get_run(run_id: str) -> dict[str, Any]:
    """One run's record as a dict (config text included)."""
    from engine.tracking import readers

    with _db() as db:
        return readers.get_run(run_id, db=db).to_dict()


def poll_run(run_id: str, *, after_metric: int, after_event: int) -> tuple[dict, list, list]:
    """The run record, metric rows with id > `after_metric`, event rows with id > `after_event`."""
    from engine.tracking import readers

    with _db() as db:
        run = readers.get_run(run_id, db=db).to_dict()
        metrics = readers.metrics_since(run_id, after_id=after_metric, db=db)
        events = readers.events_since(run_id, after_id=after_event, db=db)
    return run, metrics, events


def eval_rows(run_id: str) -> list[dict[str, Any]]:
    """Every evaluation score of a run, by step: step, task, metric, value, checkpoint (`base`: its base model)."""
    from engine.tracking import readers

    with _db() as db:
        rows = readers.eval_results(run_id, db=db)
    return [{k: getattr(r, k) for k in ("step", "task", "metric", "value", "checkpoint")} for r in rows]


def launch_config(
    *,
    recipe: str,
    config_text: str,
    nproc: int = 1,
    name: str | None = None,
    parent_id: str | None = None,
    module: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    output_dir: str | None = None,
) -> str:
    """Register a run from YAML text (validated by the launcher) and start it; returns its id.

    With `parent_id` the run is a clone of that run (as `tunebench clone` records it). `nnodes` > 1:
    this machine is node rank 0 of a multi-node run (`workbench.multinode_launch`).
    """
    from workbench import launcher

    run = launcher.create_run(
        recipe,
        config_text=config_text,
        nproc=nproc,
        name=name,
        parent_id=parent_id,
        kind="clone" if parent_id else "new",
        module=module,
        tags=tags,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        output_dir=output_dir,
    )
    launcher.launch(run.id)
    return run.id


def stop_run(run_id: str) -> None:
    from workbench import launcher

    launcher.stop(run_id)


def resume_run(run_id: str) -> None:
    from workbench import launcher

    launcher.resume(run_id)


def export_run(run_id: str, path: str) -> Path:
    """Write the run's config as YAML at `path`; returns the path written."""
    from workbench import launcher

    out = Path(path).expanduser()
    launcher.export(run_id, out)
    return out


def delete_run(run_id: str, *, remove_files: bool) -> str | None:
    """Delete the run's tracker rows and, when `remove_files`, what the run wrote (`launcher.delete`:
    never a folder or file it did not create). Returns None, or a line saying what was left.
    Refuses a live run (`UserError`)."""
    from workbench import launcher

    return launcher.delete(run_id, remove_files=remove_files)


def set_tags(run_id: str, tags: str) -> None:
    from engine.tracking.run_rows import update_run

    clean = ",".join(t.strip() for t in tags.replace(" ", ",").split(",") if t.strip())
    with _db() as db:
        update_run(run_id, db=db, tags=clean)


def set_notes(run_id: str, notes: str) -> None:
    from engine.tracking.run_rows import update_run

    with _db() as db:
        update_run(run_id, db=db, notes=notes)


def read_log(run_id: str, output_dir: str | None, offset: int) -> tuple[str, int]:
    """New text of `runs/<id>/stdout.log` since `offset`."""
    from engine.tracking.paths import run_dir
    from workbench.widgets.log_tail import read_new_text

    return read_new_text(Path(output_dir or run_dir(run_id)) / "stdout.log", offset)


def read_samples(run_id: str, output_dir: str | None, limit: int = 200) -> list[dict[str, Any]]:
    """The newest `limit` GRPO samples of `<output_dir or runs/<id>>/samples.jsonl`, newest first.

    Each row: step, prompt, completion, answer, reward (missing keys are None). Only the file's last
    megabyte is read; a torn last line (a write in progress) and non-JSON lines are skipped. A missing
    file reads as no samples.
    """
    import json

    from engine.tracking.paths import run_dir

    path = Path(output_dir or run_dir(run_id)) / "samples.jsonl"
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            start = max(0, size - (1 << 20))
            fh.seek(start)
            data = fh.read(size - start)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").split("\n")
    if start > 0:
        lines = lines[1:]  # the first line was cut by the seek
    rows: list[dict[str, Any]] = []
    for line in reversed(lines):
        if len(rows) >= limit:
            break
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            rows.append({k: obj.get(k) for k in ("step", "prompt", "completion", "answer", "reward")})
    return rows


def run_peak_gb(run_id: str) -> float | None:
    """The measured peak memory of a run (max `mem_peak_gb` over steps and ranks), or None."""
    from engine.tracking import readers

    with _db() as db:
        return readers.summarize(readers.get_run(run_id, db=db), db=db).mem_peak_gb


_CARDS: list[Any] | None = None
_CARDS_LOCK = threading.Lock()


def model_cards() -> list[Any]:
    """The model cards of `engine.models`, computed once per process (building every preset on the
    meta device takes seconds; call from a worker)."""
    global _CARDS
    with _CARDS_LOCK:
        if _CARDS is None:
            from engine.models import model_cards as cards

            out = cards()
            _CARDS = list(out.values()) if isinstance(out, dict) else list(out)
        return _CARDS


def _field(card: Any, name: str) -> Any:
    return card.get(name) if isinstance(card, dict) else getattr(card, name, None)


def model_card(component: str, model_node: dict[str, Any] | None = None) -> Any | None:
    """The card of a model component (`engine.models.smollm2.lora_smollm2`, `lora_`/`qlora_` prefixes
    ignored), or None when unknown. With several cards for one builder module, the one whose layers
    and width match the node's `num_layers`/`embed_dim` wins."""
    node = model_node or {}
    module, _, name = component.rpartition(".")
    name = name.lower()
    for prefix in ("qlora_", "lora_"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    cards = model_cards()
    for card in cards:  # exact builder or card name
        names = {str(_field(card, f) or "").rsplit(".", 1)[-1].lower() for f in ("name", "builder")}
        if name in names:
            return card
    family = [c for c in cards if module and str(_field(c, "builder") or "").startswith(module + ".")]
    for card in family:  # a family builder called with explicit sizes
        if _field(card, "layers") == node.get("num_layers") and _field(card, "embed_dim") == node.get(
            "embed_dim"
        ):
            return card
    return None


def local_checkpoints() -> list[dict[str, Any]]:
    """Model folders on disk: `TUNEBENCH_HOME/models/*` and the Hugging Face cache snapshots, each a
    folder with a `config.json`. Returns `{"name", "where", "path", "shown_path", "size_gb"}` rows
    (`shown_path` starts with `$TUNEBENCH_HOME` or `$HF_HUB_CACHE`)."""
    import os

    from engine.tracking.paths import tunebench_home

    places: list[tuple[str, Path]] = [("tunebench", tunebench_home() / "models")]
    hf = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    places.append(("hf cache", Path(hf)))
    rows = []
    for where, root in places:
        if not root.is_dir():
            continue
        for config in sorted(root.glob("*/config.json")) + sorted(
            root.glob("models--*/snapshots/*/config.json")
        ):
            folder = config.parent
            name = folder.name
            if folder.parent.name == "snapshots":
                name = folder.parent.parent.name.removeprefix("models--").replace("--", "/")
            size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
            shown = ("$TUNEBENCH_HOME/models/" if where == "tunebench" else "$HF_HUB_CACHE/") + str(
                folder.relative_to(root)
            )
            rows.append(
                {
                    "name": name,
                    "where": where,
                    "path": str(folder),
                    "shown_path": shown,
                    "size_gb": size / 1024**3,
                }
            )
    return rows


def download_model(repo_id: str, progress) -> Path:
    """Download a Hub model into `TUNEBENCH_HOME/models/<name>`; `progress(done_bytes, total_bytes)` is
    called from the download threads. Raises `UserError` with one line when the Hub is unreachable."""
    from engine.tracking.paths import tunebench_home

    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise UserError(f"downloads need huggingface_hub ({exc}): pip install huggingface_hub") from exc

    class _Progress(tqdm):
        def update(self, n=1):
            out = super().update(n)
            if getattr(self, "unit", "") == "B":
                progress(self.n, self.total or 0)
            return out

    target = tunebench_home() / "models" / repo_id.replace("/", "--")
    try:
        path = snapshot_download(repo_id, local_dir=target, tqdm_class=_Progress)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise UserError(
            f"cannot download {repo_id} from the Hugging Face Hub ({type(exc).__name__}): check the id and "
            "the network, or copy the model folder into TUNEBENCH_HOME/models/"
        ) from exc
    return Path(path)


_PREVIEW_CACHE: dict[tuple[str, str], tuple[Any, Any, dict]] = {}


def preview_source(node: dict[str, Any], tokenizer_path: str, index: int) -> dict[str, Any]:
    """Build one source (cached per node and tokenizer) and render sample `index` of it.

    `tokenizer_path` is a model folder or tokenizer file; empty means the demo model's tokenizer.
    Returns `{"segments": [(text, masked)], "num_tokens", "num_trained", "index", "length", "stats"}`.
    Raises the engine's `ConfigError`/`DataError` (one line) on a bad source.
    """
    import json

    from engine.data import build_dataset
    from engine.data.preview import length_stats, preview_sample
    from engine.data.tokenizers.loader import load_tokenizer

    key = (json.dumps(node, sort_keys=True, default=str), tokenizer_path)
    if key not in _PREVIEW_CACHE:
        if tokenizer_path:
            tok = load_tokenizer(tokenizer_path)
        else:
            from engine.models.demo_model import demo_model_dir

            tok = load_tokenizer(demo_model_dir())
        ds = build_dataset(node, tok)
        if len(ds) == 0:
            raise UserError(f"{node.get('source') or node.get('_component_')}: the source has no samples")
        _PREVIEW_CACHE[key] = (ds, tok, length_stats(ds))
        while len(_PREVIEW_CACHE) > 8:
            _PREVIEW_CACHE.pop(next(iter(_PREVIEW_CACHE)))
    ds, tok, stats = _PREVIEW_CACHE[key]
    index = index % len(ds)
    sample = preview_sample(ds, index, tok)
    return {
        "segments": sample.segments,
        "num_tokens": sample.num_tokens,
        "num_trained": sample.num_trained,
        "index": index,
        "length": len(ds),
        "stats": stats,
    }


def estimate_config(
    cfg: dict[str, Any], nproc: int = 1, *, overhead: bool = False, recipe: str | None = None
) -> Any:
    """The memory estimate (`engine.training.memory_estimate.MemoryEstimate`) of a run config.

    The model's shape comes from its checkpoint folder's `config.json` or its model card. `recipe`
    (default sft) adds what that recipe holds besides the policy: DPO's chosen and rejected rows and,
    for a full fine-tune, its frozen reference copy; KD's frozen teacher (`teacher_model`,
    `teacher_checkpoint_dir`); GRPO's completions as the batch, the rollouts' KV cache (synchronous
    GRPO) and, for a full fine-tune with a KL term, its frozen reference. Raises `UserError` when a shape is not known, `MemoryEstimateError` on
    an option it cannot estimate.
    """
    from engine.training.memory_estimate import (
        ModelShape,
        TrainingOptions,
        estimate_memory,
        frozen_model_bytes,
    )
    from workbench.recipe_options import training_options

    if recipe == "reward_model" and isinstance((cfg.get("model") or {}).get("decoder"), dict):
        # a decoder under a score head: sized like SFT on the decoder, chosen + rejected rows
        cfg = {**cfg, "model": cfg["model"]["decoder"]}
    shape = ModelShape.from_card(_model_shape_card(cfg, "model"))
    opts = training_options(cfg, nproc, recipe)
    if recipe == "dpo":
        opts["sequences_per_sample"] = 2
        if opts["method"] == "full":
            opts["frozen_models"] = (("reference model", frozen_model_bytes(shape, opts["dtype"])),)
    elif recipe in ("grpo", "grpo_async"):
        opts.update(_grpo_rows(cfg, sync=recipe == "grpo"))
        loss = cfg.get("loss") if isinstance(cfg.get("loss"), dict) else {}
        kl = loss.get("kl_coeff", 0.04)
        if opts["method"] == "full" and isinstance(kl, (int, float)) and kl > 0:
            opts["frozen_models"] = (("reference model", frozen_model_bytes(shape, opts["dtype"])),)
    elif recipe == "reward_model":
        opts["sequences_per_sample"] = 2
    elif recipe == "ppo":
        opts.update(_grpo_rows({**cfg, "group_size": cfg.get("num_samples", 1)}, sync=True))
        opts["frozen_models"] = _ppo_side_models(cfg, shape, opts)
    elif recipe == "kd" and isinstance(cfg.get("teacher_model"), dict):
        teacher_cfg = {"model": cfg["teacher_model"], "checkpoint_dir": cfg.get("teacher_checkpoint_dir")}
        teacher = ModelShape.from_card(_model_shape_card(teacher_cfg, "teacher_model"))
        opts["frozen_models"] = (("teacher model", frozen_model_bytes(teacher, opts["dtype"])),)
    return estimate_memory(shape, TrainingOptions(**opts), overhead=overhead)


def _ppo_side_models(cfg: dict[str, Any], policy: Any, opts: dict[str, Any]) -> tuple:
    """PPO's models besides the policy: a full policy's frozen reference, the frozen reward model and
    the trained value model (each sized from its `decoder` node and folder, else the policy's shape)."""
    from engine.training.memory_estimate import ModelShape, frozen_model_bytes, trained_side_model_bytes
    from workbench.recipe_options import method_of

    def shape_of(key: str, folder_key: str) -> Any:
        node = cfg.get(key) if isinstance(cfg.get(key), dict) else {}
        if not isinstance(node.get("decoder"), dict):
            return policy
        return ModelShape.from_card(
            _model_shape_card({"model": node["decoder"], "checkpoint_dir": cfg.get(folder_key)}, key)
        )

    out = []
    if opts["method"] == "full":
        out.append(("reference model", frozen_model_bytes(policy, opts["dtype"])))
    if isinstance(cfg.get("reward_model"), dict):
        out.append(
            (
                "reward model",
                frozen_model_bytes(shape_of("reward_model", "reward_checkpoint_dir"), opts["dtype"]),
            )
        )
    if isinstance(cfg.get("value_model"), dict):
        decoder = (
            cfg["value_model"].get("decoder") if isinstance(cfg["value_model"].get("decoder"), dict) else {}
        )
        full = method_of({"model": decoder}) == "full"
        value = trained_side_model_bytes(
            shape_of("value_model", "value_checkpoint_dir"), opts["dtype"], opts["optimizer"], full=full
        )
        out.append(("value model", value))
    return tuple(out)


def _grpo_rows(cfg: dict[str, Any], *, sync: bool) -> dict[str, int]:
    """GRPO's training batch (`minibatch_size` completions, else `batch_size * group_size`) of
    `max_prompt_len + max_new_tokens` tokens, and (synchronous GRPO, which samples in the trainer) the
    rollout tokens whose keys and values generation caches. A prompt length the config does not cap
    (`dataset.max_prompt_len`) counts as 512 tokens."""

    def positive(value: Any, default: int) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    dataset = cfg.get("dataset") if isinstance(cfg.get("dataset"), dict) else {}
    rows = positive(cfg.get("batch_size"), 1) * positive(cfg.get("group_size"), 1)
    length = positive(dataset.get("max_prompt_len"), 512) + positive(cfg.get("max_new_tokens"), 256)
    out = {"batch_size": positive(cfg.get("minibatch_size"), rows), "seq_len": length}
    if sync:
        out["rollout_kv_tokens"] = rows * length
    return out


def _model_shape_card(cfg: dict[str, Any], field: str) -> Any:
    """The shape card of `cfg["model"]`: its folder's `config.json`, its own sizes, or a model card."""
    from workbench.recipe_options import card_with_overrides, model_shape_source

    source = model_shape_source(cfg)
    node = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    if isinstance(source, dict):
        return source
    if all(node.get(k) for k in ("num_layers", "embed_dim", "vocab_size")):
        return card_with_overrides({}, node)  # a builder called with every size: no card needed
    if not source:
        raise UserError(f"no estimate: the config has no `{field}` component to size")
    found = model_card(source, node)
    if found is None:
        raise UserError(f"no model card for {source!r} ({field}): the estimate needs the model's shape")
    return card_with_overrides(found, node)
