"""`tunebench generate MODEL "prompt" [--chat] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]`:
continue a prompt with a model, using the KV-cached generation that GRPO rollouts use.

MODEL is a Hugging Face folder (`config.json` + safetensors + tokenizer), a llama `.gguf` file
(converted once into `TUNEBENCH_HOME/models/`), `demo` (SmolLM2-135M-Instruct, converted offline on first use), a run's checkpoint folder (`runs/<id>/checkpoints/step_<N>`), a run id
or a run folder (its latest checkpoint), or a local model name from `tunebench models`.
`--chat` wraps the prompt in the model's chat template as a user message (with `--system TEXT`).
The completion goes to stdout; token counts and speed to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from pathlib import Path

from workbench.cli_args import add_documented_command
from workbench.errors import UserError

_STEP = re.compile(r"^step_(\d+)$")


_HELP = "generate text from a model folder, a run checkpoint or the demo model"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_documented_command(subparsers, "generate", _HELP, __doc__)
    p.add_argument(
        "model", metavar="MODEL", help="model folder, `demo`, run checkpoint, run id, or local model name"
    )
    p.add_argument("prompt", metavar="PROMPT", help="the text to continue (a user message with --chat)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    p.add_argument("--system", default=None, help="system message for --chat")
    p.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=None, help="sample among the K most likely tokens")
    p.add_argument(
        "--top-p", type=float, default=None, help="sample from the smallest set with probability >= P"
    )
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="default: float32 on CPU, bfloat16 on GPU",
    )
    p.add_argument("--no-stream", action="store_true", help="print the completion only at the end")
    p.set_defaults(func=run)


class _Stream:
    """Prints the completion as it grows (on a terminal), through `engine.generation.TextStream` (so
    multi-byte characters split across tokens come out whole)."""

    def __init__(self, tokenizer) -> None:
        from engine.generation import TextStream

        self.text = TextStream(tokenizer)
        self.step = self.text.on_step(self._write)

    @staticmethod
    def _write(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    def __call__(self, tokens, running) -> None:
        self.step(tokens, running)

    def finish(self, text: str) -> None:
        rest = self.text.finish()
        sys.stdout.write(("\n" + text if rest is None else rest) + "\n")
        sys.stdout.flush()


def _latest_step(folder: Path) -> Path | None:
    """The `step_<N>` folder with the largest N that holds a `config.json` (under `checkpoints/` or not)."""
    steps = []
    for base in (folder / "checkpoints", folder):
        if base.is_dir():
            for child in base.iterdir():
                match = _STEP.match(child.name)
                if match and (child / "config.json").is_file():
                    steps.append((int(match.group(1)), child))
    return max(steps)[1] if steps else None


def _converted_gguf(path: Path) -> Path:
    """The HF folder converted from GGUF `path` under `TUNEBENCH_HOME/models/<file stem>` (converted once)."""
    from engine.checkpoint.gguf import convert_gguf_to_hf
    from engine.tracking.paths import tunebench_home

    target = tunebench_home() / "models" / path.stem
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    print(f"converting {path} to {target} (once)", file=sys.stderr)
    return convert_gguf_to_hf(path, target, overwrite=target.exists())


def resolve_model(spec: str) -> Path:
    """The HF-format folder MODEL names. Raises `UserError` saying what was looked for."""
    if spec == "demo":
        from engine.models.demo_model import demo_model_dir

        return demo_model_dir()
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        step = _latest_step(path)
        if step is not None:
            return step
        raise UserError(
            f"{path}: no config.json and no checkpoints/step_<N>/ with one; point MODEL at a model folder"
        )
    if path.is_file() and path.suffix == ".gguf":
        return _converted_gguf(path)
    if path.exists():
        raise UserError(
            f"{path}: is a file; MODEL must be a model folder (config.json + weights), a .gguf, `demo` or a run id"
        )
    from engine.tracking.paths import run_dir

    run = run_dir(spec)
    if re.fullmatch(r"[\w.-]+", spec) and run.is_dir():
        step = _latest_step(run)
        if step is None:
            raise UserError(f"run {spec}: no checkpoint with a config.json under {run}/checkpoints yet")
        return step
    from workbench.commands.models import local_models

    for m in local_models():
        if m.ready and m.name == spec:
            return Path(m.path)
    raise UserError(
        f"MODEL {spec!r}: not a folder, run id or local model; use a model folder, `demo`, or a name from `tunebench models --local`"
    )


def _check_args(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {args.max_new_tokens}: must be at least 1")
    if args.temperature < 0:
        raise UserError(f"--temperature {args.temperature}: must be >= 0 (0 = greedy)")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k {args.top_k}: must be a positive integer")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UserError(f"--top-p {args.top_p}: must be in (0, 1]")
    if args.system is not None and not args.chat:
        raise UserError("--system: only applies with --chat; add --chat")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    import torch

    from engine.data.tokenizers import load_tokenizer
    from engine.generation import generate
    from engine.models import from_pretrained
    from engine.training.cpu_fast_paths import Bf16MatmulsInFp32, wants_bf16_matmuls_in_fp32

    folder = resolve_model(args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype_name = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    tok = load_tokenizer(folder)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + [
            {"role": "user", "content": args.prompt}
        ]
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    else:
        prompt = tok.encode(args.prompt, add_bos=True, add_eos=False)
    if not prompt:
        raise UserError("PROMPT: encodes to no tokens; give some text")
    model = from_pretrained(folder, dtype=getattr(torch, dtype_name), device=device)
    max_len = getattr(model, "max_seq_len", None)
    if max_len is not None and len(prompt) + args.max_new_tokens > max_len:
        raise UserError(
            f"--max-new-tokens {args.max_new_tokens}: with a {len(prompt)}-token prompt this exceeds the model's "
            f"context of {max_len}; lower it"
        )
    stream = _Stream(tok) if sys.stdout.isatty() and not args.no_stream else None
    # bf16 on a CPU without bf16 instructions: matmuls in fp32, rounded to bf16 (~30x faster there)
    upcast = wants_bf16_matmuls_in_fp32(torch.device(device), getattr(torch, dtype_name))
    start = time.perf_counter()
    with Bf16MatmulsInFp32() if upcast else contextlib.nullcontext():
        out = generate(
            model,
            [prompt],
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            stop_tokens=tok.stop_tokens,
            pad_id=tok.pad_id,
            seed=args.seed,
            on_step=stream,
        )
    seconds = time.perf_counter() - start
    text = tok.decode(out.completions[0], skip_special_tokens=True)
    if stream is None:
        print(text)
    else:
        stream.finish(text)
    n = int(out.lengths[0])
    reason = "stop token" if bool(out.stopped[0]) else "max-new-tokens"
    print(
        f"[{folder}: {len(prompt)} prompt + {n} new tokens in {seconds:.2f}s, {n / max(seconds, 1e-9):.1f} tok/s, ended by {reason}"
        + (", bf16 matmuls in fp32 on this CPU" if upcast else "")
        + "]",
        file=sys.stderr,
    )
    return 0
