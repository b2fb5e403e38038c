"""Read the Hugging Face side files next to a tokenizer: `tokenizer_config.json`,
`special_tokens_map.json`, `chat_template.jinja` and `generation_config.json`.

They carry what the vocabulary file alone does not: which strings are BOS/EOS/PAD, whether BOS is
prepended, the chat template, and the extra end-of-turn ids generation stops on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.data.tokenizers.tokenizer_errors import TokenizerError


@dataclass
class TokenizerFiles:
    """What the side files say. Token fields are strings (``None`` when unset)."""

    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    chat_template: str | None = None
    added_tokens: dict[int, str] = field(default_factory=dict)  # id -> content (tokenizer_config.json)
    generation_eos_ids: list[int] = field(default_factory=list)  # generation_config.json eos_token_id


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(
            f"{path}: not readable JSON ({exc}); restore the file from the model's source"
        ) from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object at the top level; restore the file")
    return data


def _token_string(value: Any) -> str | None:
    """Special tokens appear as plain strings or as AddedToken dicts ``{"content": ...}``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _pick_template(value: Any, path: Path) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
        if named:
            return next(iter(named.values()))
    raise TokenizerError(f"{path}: `chat_template` must be a string or a list of {{name, template}}; fix it")


def read_tokenizer_files(folder: Path) -> TokenizerFiles:
    """Collect the side files of `folder` (each optional). Raises `TokenizerError` on unreadable JSON."""
    out = TokenizerFiles()
    stm = folder / "special_tokens_map.json"
    if stm.is_file():
        data = _read_json(stm)
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            setattr(out, key, _token_string(data.get(key)))
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        data = _read_json(cfg)
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            if key in data:
                setattr(out, key, _token_string(data[key]))
        for key in ("add_bos_token", "add_eos_token"):
            if isinstance(data.get(key), bool):
                setattr(out, key, data[key])
        out.chat_template = _pick_template(data.get("chat_template"), cfg)
        for idx, tok in (data.get("added_tokens_decoder") or {}).items():
            content = _token_string(tok)
            if content is not None and str(idx).isdigit():
                out.added_tokens[int(idx)] = content
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        out.chat_template = jinja.read_text(encoding="utf-8")
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = _read_json(gen).get("eos_token_id")
        if isinstance(eos, int):
            out.generation_eos_ids = [eos]
        elif isinstance(eos, list):
            out.generation_eos_ids = [int(e) for e in eos if isinstance(e, int)]
    return out
