"""Which checkpoint folders this home's runs wrote: a keyed mark, checked before anything is unpickled.

Resume loads `state/.metadata` of a torch.distributed.checkpoint folder, and DCP reads that file with
`pickle.load` (and non-tensor entries of the state with `torch.load(weights_only=False)`): a checkpoint
folder from elsewhere can run any code. So a run marks every checkpoint it writes, and resume refuses a
folder without a valid mark unless the user says they trust it.

    step_<N>/tunebench_mark.json    {"version": 1, "mac": HMAC-SHA256(key, folder path + SHA-256(.metadata))}

The key is 32 random bytes in `TUNEBENCH_HOME/checkpoint.key` (mode 0600, made by the first save), so
nobody without the user's home can forge a mark, and a mark holds only for the folder it was written
in (a moved or copied checkpoint is foreign again) and for that exact metadata file.
The user trusts a foreign folder with `tunebench resume RUN --trust-checkpoint`, which sets
`TUNEBENCH_TRUST_CHECKPOINT=1` for the run's processes (set it by hand for a recipe started by hand). A
config cannot: the setting is not a config key. Imports no torch (the launcher checks before launching).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from engine.config import ConfigError

MARK_NAME = "tunebench_mark.json"
KEY_NAME = "checkpoint.key"
TRUST_ENV = "TUNEBENCH_TRUST_CHECKPOINT"
_METADATA = Path("state") / ".metadata"


class UntrustedCheckpointError(ConfigError):
    """A checkpoint folder this home's runs did not write (or that changed since): one line, what to do."""


def _home() -> Path:
    return Path(os.environ.get("TUNEBENCH_HOME") or "~/.tunebench").expanduser()


def _key(*, create: bool) -> bytes | None:
    """This home's checkpoint key; made (atomically: the first of several racing runs wins) when
    `create` and absent. None when absent and not `create`."""
    path = _home() / KEY_NAME
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        if not create:
            return None
    except ValueError:
        return None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    try:
        os.link(tmp, path)  # fails when another run made the key first: then that one is the key
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return bytes.fromhex(path.read_text().strip())


def _mac(key: bytes, folder: Path, metadata: Path) -> str:
    try:
        digest = hashlib.sha256(metadata.read_bytes()).hexdigest()
    except OSError:
        digest = "none"
    text = f"{Path(folder).resolve()}\n{digest}".encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def mark_written(folder: str | os.PathLike, final: str | os.PathLike) -> None:
    """Mark the checkpoint being written in `folder` (its DCP metadata complete) as this home's, for the
    path `final` it is renamed to. Call on the rank that wrote the metadata (rank 0), before the file
    that completes the checkpoint."""
    folder = Path(folder)
    mark = {"version": 1, "mac": _mac(_key(create=True), Path(final), folder / _METADATA)}
    tmp = folder / f".{MARK_NAME}.tmp"
    tmp.write_text(json.dumps(mark))
    os.replace(tmp, folder / MARK_NAME)


def why_foreign(path: str | os.PathLike) -> str | None:
    """None when the checkpoint folder `path` carries a valid mark of this home, else why not."""
    path = Path(path)
    key = _key(create=False)
    if key is None:
        return f"this TUNEBENCH_HOME has no {KEY_NAME}, so none of its runs wrote it"
    try:
        mark = json.loads((path / MARK_NAME).read_text())
        mac = str(mark["mac"])
    except FileNotFoundError:
        return f"it has no {MARK_NAME}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MARK_NAME} is unreadable"
    if not hmac.compare_digest(mac, _mac(key, path, path / _METADATA)):
        return "its mark does not match (written in another folder or home, or changed since)"
    return None


def trusted_by_user() -> bool:
    """The user said to trust foreign checkpoints for this process (`TUNEBENCH_TRUST_CHECKPOINT=1`)."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


def untrusted_error(path: str | os.PathLike, why: str) -> UntrustedCheckpointError:
    """The one-line refusal of the foreign checkpoint folder `path`."""
    return UntrustedCheckpointError(
        f"not written by a run of this TUNEBENCH_HOME in this folder ({why}); resuming unpickles its"
        " torch.distributed.checkpoint metadata, which can run code",
        hint="resume only a checkpoint you trust, with `tunebench resume RUN --trust-checkpoint`"
        f" ({TRUST_ENV}=1 for a recipe started by hand)",
        field=str(path),
    )


def check_written_here(path: str | os.PathLike) -> None:
    """Raise UntrustedCheckpointError unless `path` carries this home's mark or the user trusts it.

    Collective when torch.distributed is initialised: rank 0 decides and every rank gets its verdict
    (the nodes of a multi-node run have homes of their own; they read the same shared folder).
    """
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    why = None
    if not distributed or dist.get_rank() == 0:
        why = None if trusted_by_user() else why_foreign(path)
    if distributed:
        box = [why]
        dist.broadcast_object_list(box, src=0)
        why = box[0]
    if why is not None:
        raise untrusted_error(path, why)
