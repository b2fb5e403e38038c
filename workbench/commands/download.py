"""`tunebench download REPO_ID [--output-dir DIR] [--revision REV] [--include GLOB ...]`: fetch a model
from the Hugging Face Hub into the local model registry.

Files go to `--output-dir`, default `TUNEBENCH_HOME/models/<org>--<name>/`, which `tunebench models`
lists. Only what tunebench loads is fetched (config, safetensors, tokenizer files), unless `--include`
says otherwise. Downloads show progress and resume where an interrupted one stopped. A gated or private
repository needs a token: `HF_TOKEN` in the environment (or `hf auth login`).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from workbench.cli_args import add_documented_command
from workbench.errors import UserError

# What tunebench loads; .bin/.pth/.gguf duplicates of the same weights are skipped by default.
DEFAULT_PATTERNS = (
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "*.jinja",
    "*.txt",
    "*.md",
    "LICENSE*",
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


_HELP = "download a model from the Hugging Face Hub (resumable) into TUNEBENCH_HOME/models"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_documented_command(subparsers, "download", _HELP, __doc__)
    p.add_argument("repo_id", metavar="REPO_ID", help="e.g. HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument(
        "--output-dir", default=None, help="where to put the files (default: TUNEBENCH_HOME/models/ORG--NAME)"
    )
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument(
        "--include",
        action="append",
        default=None,
        metavar="GLOB",
        help="file patterns to fetch (repeatable; default: config, safetensors and tokenizer files)",
    )
    p.set_defaults(func=run)


def default_output_dir(repo_id: str) -> Path:
    """`TUNEBENCH_HOME/models/<org>--<name>`."""
    from engine.tracking.paths import tunebench_home

    return tunebench_home() / "models" / repo_id.replace("/", "--")


def run(args: argparse.Namespace) -> int:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id = args.repo_id.strip()
    if not _REPO_ID.match(repo_id):
        raise UserError(
            f"REPO_ID {repo_id!r}: write it as ORG/NAME, e.g. HuggingFaceTB/SmolLM2-135M-Instruct"
        )
    out = Path(args.output_dir).expanduser() if args.output_dir else default_output_dir(repo_id)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output-dir {out}: is a file; choose a folder")
    endpoint = os.environ.get("HF_ENDPOINT") or None  # read now, not at import time
    print(f"downloading {repo_id} to {out}")
    try:
        path = snapshot_download(
            repo_id,
            revision=args.revision,
            local_dir=out,
            allow_patterns=list(args.include or DEFAULT_PATTERNS),
            endpoint=endpoint,
        )
    except GatedRepoError:
        raise UserError(
            f"{repo_id}: gated repository; accept its licence on huggingface.co and set HF_TOKEN to a token with access"
        ) from None
    except RepositoryNotFoundError:
        raise UserError(
            f"{repo_id}: repository not found (or private); check the name, or set HF_TOKEN for a private one"
        ) from None
    except RevisionNotFoundError:
        raise UserError(
            f"--revision {args.revision}: not found in {repo_id}; use a branch, tag or commit that exists"
        ) from None
    except LocalEntryNotFoundError:
        raise UserError(
            f"{repo_id}: cannot reach the Hugging Face Hub ({endpoint or 'huggingface.co'}) and no local copy exists; "
            "check the network (or HF_ENDPOINT / HF_HUB_OFFLINE) and run the command again to resume"
        ) from None
    except HfHubHTTPError as exc:
        raise UserError(
            f"{repo_id}: the Hub refused the download ({str(exc).splitlines()[0]}); try again later"
        ) from None
    except OSError as exc:
        raise UserError(
            f"{out}: cannot write the download ({exc.strerror}); choose another --output-dir"
        ) from None
    path = Path(path)
    if not (path / "config.json").is_file():
        print(f"note: {path} has no config.json; `tunebench models` lists only folders with one")
    print(f"done: {path}")
    return 0
