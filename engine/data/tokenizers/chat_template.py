"""Render a model's Jinja chat template (from `tokenizer_config.json`) in a sandbox.

Templates are untrusted text shipped with checkpoints, so they run in jinja2's immutable sandbox:
no attribute access to Python internals, no mutation of the arguments. The environment follows the
conventions chat templates are written for: `trim_blocks`/`lstrip_blocks`, the `loopcontrols`
extension, a `raise_exception(msg)` global, a `strftime_now(fmt)` global and a `tojson` filter that
keeps non-ASCII text as is.
"""

from __future__ import annotations

import datetime
import json
from functools import lru_cache
from typing import Any

from engine.data.tokenizers.tokenizer_errors import TokenizerError


class ChatTemplateError(TokenizerError):
    """The template failed to compile, or raised while rendering (e.g. its own `raise_exception`)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise ChatTemplateError(
            f"chat template does not compile ({exc}); fix `chat_template` in tokenizer_config.json"
        ) from None


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = False,
    special_tokens: dict[str, str | None] | None = None,
    **extra: Any,
) -> str:
    """Render `messages` (``[{"role": ..., "content": ...}, ...]``) with the Jinja `source`.

    `special_tokens` supplies `bos_token`, `eos_token`, ... as the template expects; `extra` passes
    template-specific switches (e.g. Qwen3's `enable_thinking=False`, `tools=[...]`).
    Raises `ChatTemplateError` when the template does not compile or raises while rendering.
    """
    from jinja2 import TemplateError

    template = _compile(source)
    context: dict[str, Any] = {"tools": None, "documents": None}
    context.update(special_tokens or {})
    context.update(extra)
    context["messages"] = messages
    context["add_generation_prompt"] = add_generation_prompt
    try:
        return template.render(**context)
    except TemplateError as exc:
        raise ChatTemplateError(f"chat template failed while rendering: {exc}") from None
