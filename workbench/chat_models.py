"""What the Playground chats with, without any UI: a model spec -> a loaded model and its tokenizer,
a conversation -> prompt ids (the tokenizer's chat template, as `tunebench generate --chat`), and a
reply generated with the native KV cache and handed out as text pieces while it grows.

Model specs (`SPEC_HELP`): `demo` (the embedded SmolLM2-135M-Instruct), a model folder (Hugging Face
files, or a LoRA checkpoint's PEFT adapters on the base they name), a `.gguf` file, a checkpoint
folder `runs/<id>/checkpoints/step_<N>`, a run folder, a run id or name (its latest checkpoint),
`RUN@N` (the checkpoint of step N), `RUN@base` (the model the run started from) or a local model name
from `tunebench models`. Resolving reads the tracker and loading reads weights: both run in the
Playground's workers, never on the UI thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from workbench.errors import UserError

SPEC_HELP = "demo, a model folder, a checkpoint or run folder, a run id or name, RUN@STEP or RUN@base"
DEMO_LABEL = "demo · SmolLM2-135M-Instruct"
_STEP = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class ChatSource:
    """A resolved model spec: `folder` holds the weights (`demo`: converted when loaded), `label`
    is what the Playground shows, `quantize_base` keeps a QLoRA run's base in NF4 as it trained."""

    spec: str
    label: str
    folder: str
    quantize_base: bool = False


@dataclass(frozen=True)
class SamplingSettings:
    """Temperature 0 is greedy; `top_p` None (or 1) samples from the whole distribution."""

    temperature: float = 0.0
    top_p: float | None = None
    max_new_tokens: int = 256


@dataclass(frozen=True)
class Reply:
    """A finished reply: its text, token counts, seconds and why it ended (`stop token`,
    `max tokens` or `stopped` by the user)."""

    text: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    reason: str

    def summary(self) -> str:
        rate = self.new_tokens / max(self.seconds, 1e-9)
        return f"{self.new_tokens} tokens in {self.seconds:.1f}s, {rate:.1f} tok/s, ended by {self.reason}"


def parse_settings(temperature: str, top_p: str, max_new_tokens: str) -> SamplingSettings:
    """The three controls' text as settings. Raises `UserError` naming the control and the range."""
    try:
        temp = float(temperature or 0)
    except ValueError:
        raise UserError(f"temperature {temperature!r}: not a number; use 0 (greedy) or more") from None
    if not temp >= 0:
        raise UserError(f"temperature {temperature}: must be >= 0 (0 = greedy)")
    try:
        p = float(top_p or 1)
    except ValueError:
        raise UserError(f"top-p {top_p!r}: not a number; use a value in (0, 1]") from None
    if not 0 < p <= 1:
        raise UserError(f"top-p {top_p}: must be in (0, 1]")
    try:
        n = int(max_new_tokens or 0)
    except ValueError:
        raise UserError(f"max tokens {max_new_tokens!r}: not a whole number") from None
    if n < 1:
        raise UserError(f"max tokens {max_new_tokens}: must be at least 1")
    return SamplingSettings(temperature=temp, top_p=None if p >= 1 else p, max_new_tokens=n)


# Resolving specs -------------------------------------------------------------------------------
def _model_folder(path: Path) -> Path | None:
    """`path` itself or its `model/` when either holds a config.json or PEFT adapters."""
    for folder in (path, path / "model"):
        if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
            return folder
    return None


def _run_checkpoints(output_dir: Path) -> dict[int, Path]:
    from workbench.commands.evaluate import checkpoint_steps

    return checkpoint_steps(output_dir)


def _nf4(config_text: str) -> bool:
    from workbench.commands.evaluate import trained_with_nf4_base

    return trained_with_nf4_base(config_text)


def _run_base(spec: str, rec: Any) -> ChatSource:
    """The model a run started from: its config's `checkpoint_dir`."""
    import yaml

    try:
        cfg = yaml.safe_load(rec.config_text or "") or {}
    except yaml.YAMLError:
        cfg = {}
    base = cfg.get("checkpoint_dir") if isinstance(cfg, dict) else None
    if not base or "${" in str(base):
        raise UserError(
            f"run {rec.name}: its config names no plain checkpoint_dir; open the base model folder itself"
        )
    if str(base) == "demo":
        return ChatSource(spec, f"base of {rec.name} · {DEMO_LABEL}", "demo")
    folder = Path(str(base)).expanduser()
    if not (folder / "config.json").is_file():
        raise UserError(f"run {rec.name}: its base {folder} is not a model folder (no config.json)")
    return ChatSource(spec, f"base of {rec.name} · {folder.name}", str(folder))


def _from_run(spec: str, run: str, which: str | None) -> ChatSource | None:
    """`RUN`, `RUN@N` or `RUN@base` from the tracker; None when there is no such run."""
    from engine.tracking.db import open_db
    from engine.tracking.paths import db_path
    from engine.tracking.readers import get_run
    from engine.tracking.tracker_errors import RunNotFound

    if not db_path().exists():
        return None
    try:
        with open_db(create=False) as db:
            rec = get_run(run, db=db)
    except RunNotFound:
        return None
    if which == "base":
        return _run_base(spec, rec)
    steps = _run_checkpoints(Path(rec.output_dir))
    if not steps:
        raise UserError(
            f"run {rec.name} has no checkpoint yet under {rec.output_dir}/checkpoints; "
            f"chat with its base ({rec.name}@base) or wait for one"
        )
    if which is None:
        step = max(steps)
    elif which.isdigit() and int(which) in steps:
        step = int(which)
    else:
        raise UserError(
            f"{spec}: run {rec.name} has checkpoints at steps {sorted(steps)}; use {rec.name}@STEP"
        )
    return ChatSource(spec, f"{rec.name} · step {step}", str(steps[step]), _nf4(rec.config_text))


def resolve_chat_source(spec: str) -> ChatSource:
    """The model a spec names (see the module docstring). Raises `UserError` saying what was looked for."""
    spec = spec.strip()
    if not spec:
        raise UserError(f"model: empty; give {SPEC_HELP}")
    if spec == "demo":
        return ChatSource("demo", DEMO_LABEL, "demo")
    path = Path(spec).expanduser()
    if path.is_dir():
        found = _model_folder(path)
        if found is not None:
            name = path.parent.parent.name + " · " + path.name if _STEP.match(path.name) else path.name
            return ChatSource(spec, name, str(found))
        steps = _run_checkpoints(path)
        if steps:
            step = max(steps)
            return ChatSource(spec, f"{path.name} · step {step}", str(steps[step]))
        raise UserError(
            f"{path}: not a model (no config.json, adapter_config.json or checkpoints/step_<N>/); "
            f"give {SPEC_HELP}"
        )
    if path.is_file() and path.suffix != ".gguf":
        raise UserError(f"{path}: is a file, not a model; give {SPEC_HELP}")
    if not path.exists() and (spec.startswith((".", "~")) or "/" in spec.partition("@")[0]):
        raise UserError(f"{path}: no such file or folder; give {SPEC_HELP}")
    if not path.exists():
        run, _, which = spec.partition("@")
        found = _from_run(spec, run, which or None)
        if found is not None:
            return found
        if which:
            raise UserError(f"{spec}: no run named {run!r}; `tunebench runs` lists them")
    from workbench.commands.generate import resolve_model  # a .gguf (converted once) or a local model name

    try:
        folder = resolve_model(spec)
    except UserError:
        raise UserError(f"model {spec!r}: no such folder, run or local model; give {SPEC_HELP}") from None
    return ChatSource(spec, Path(folder).name, str(folder))


# Loading ---------------------------------------------------------------------------------------
class ChatModel:
    """A loaded model and tokenizer that answers conversations. One reply at a time (the model's KV
    cache is set up per call); two ChatModels may generate at once in two threads."""

    def __init__(self, source: ChatSource, model: Any, tokenizer: Any, device: str) -> None:
        self.source = source
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.chat = tokenizer.chat_template is not None

    @property
    def label(self) -> str:
        return self.source.label

    def prompt_ids(self, messages: list[dict[str, str]], max_new_tokens: int) -> list[int]:
        """Ids of the conversation with the chat template and the assistant's generation prompt;
        without a template, the last user message as plain text. The oldest exchanges are dropped
        until the prompt and `max_new_tokens` fit the model's context. Raises `UserError` when even the
        last message does not fit."""
        limit = getattr(self.model, "max_seq_len", None)
        turns = list(messages)
        while True:
            if self.chat:
                ids = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
            else:
                ids = self.tokenizer.encode(turns[-1]["content"], add_bos=True, add_eos=False)
            if limit is None or len(ids) + max_new_tokens <= limit:
                break
            if len(turns) <= 1:
                raise UserError(
                    f"max tokens {max_new_tokens}: with a {len(ids)}-token prompt this exceeds the model's "
                    f"context of {limit}; lower max tokens or shorten the message"
                )
            turns = turns[2:] if len(turns) > 2 else turns[1:]  # drop the oldest user/assistant pair
        if not ids:
            raise UserError("message: encodes to no tokens; type some text")
        return ids

    def reply(
        self,
        messages: list[dict[str, str]],
        settings: SamplingSettings,
        *,
        on_text: Callable[[str], None],
        should_stop: Callable[[], bool] | None = None,
        seed: int | None = None,
    ) -> Reply:
        """Answer the last user message of `messages`, calling `on_text(piece)` as the text grows;
        `should_stop()` True ends the reply early. The pieces concatenate to the reply's text."""
        from engine.generation import TextStream, generate

        ids = self.prompt_ids(messages, settings.max_new_tokens)
        stream = TextStream(self.tokenizer)
        start = perf_counter()
        out = generate(
            self.model,
            [ids],
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            stop_tokens=self.tokenizer.stop_tokens,
            pad_id=self.tokenizer.pad_id,
            seed=seed,
            on_step=stream.on_step(on_text),
            should_stop=should_stop,
        )
        seconds = perf_counter() - start
        text = self.tokenizer.decode(out.completions[0], skip_special_tokens=True)
        rest = stream.finish()
        if rest:
            on_text(rest)
        n = int(out.lengths[0])
        if bool(out.stopped[0]):
            reason = "stop token"
        elif n < settings.max_new_tokens:
            reason = "stop key"
        else:
            reason = "max tokens"
        return Reply(text=text, prompt_tokens=len(ids), new_tokens=n, seconds=seconds, reason=reason)


def load_chat_model(source: ChatSource, *, device: str | None = None) -> ChatModel:
    """Load `source` (float32 on CPU, bfloat16 on a GPU). Raises `UserError`/engine errors (one line
    each) for folders that are not models or tokenizers that do not fit."""
    import torch

    from engine.data.tokenizers import load_tokenizer
    from engine.eval.model_loading import load_eval_model, tokenizer_folder

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if source.folder == "demo":
        from engine.models.demo_model import demo_model_dir

        folder = Path(demo_model_dir())
    else:
        folder = Path(source.folder)
    tok_dir = tokenizer_folder(folder)
    if not any(
        (tok_dir / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    ):
        raise UserError(f"{tok_dir}: no tokenizer files (tokenizer.json); copy the model's tokenizer there")
    tokenizer = load_tokenizer(tok_dir)
    model = load_eval_model(folder, dtype=dtype, device=device, quantize_base=source.quantize_base)
    rows = getattr(getattr(model, "tok_embeddings", None), "num_embeddings", None)
    if isinstance(rows, int) and tokenizer.vocab_size > rows:
        raise UserError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but the model only {rows} embeddings; "
            "use the model's own tokenizer"
        )
    return ChatModel(source, model, tokenizer, device)


def one_line(exc: BaseException) -> str:
    """An exception as the one line the Playground shows (the first line of its message)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if isinstance(exc, UserError) or ":" in text else f"{type(exc).__name__}: {text}"
