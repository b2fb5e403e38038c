"""Turn the Data screen's form into dataset config nodes, and a list of sources into one mix node.

Pure functions (no textual, no torch): the nodes are what a config's `dataset:` holds, built by
`engine.data.build_dataset` in the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.errors import UserError

PRESETS = (
    "demo",
    "alpaca",
    "alpaca_cleaned",
    "slimorca",
    "samsum",
    "grammar",
    "stack_exchange_paired",
    "hh_rlhf",
    "gsm8k",
    "wikitext",
)
BUILDERS = ("instruct", "chat", "preference", "text_completion")
KINDS = ("preset", "local file", "hub id")


@dataclass
class SourceForm:
    """One source as the user describes it.

    kind: preset | local file | hub id; `preset` names a preset (for kind preset); `source` is a path or
    Hub id (optional for presets: a local copy); `column_map` is `field=column,field=column`.
    """

    kind: str = "preset"
    preset: str = "demo"
    source: str = ""
    builder: str = "instruct"
    template: str = ""
    chat_format: str = ""
    column_map: str = ""
    train_on_input: bool = False
    weight: float = 1.0
    max_seq_len: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_column_map(text: str) -> dict[str, str]:
    """`input=question, output=answer` -> `{"input": "question", "output": "answer"}`."""
    out: dict[str, str] = {}
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise UserError(
                f"column map: {part!r} is not field=column; write e.g. input=question,output=answer"
            )
        k, v = (s.strip() for s in part.split("=", 1))
        if not k or not v:
            raise UserError(f"column map: {part!r} needs both a field and a column name")
        out[k] = v
    return out


def source_node(form: SourceForm) -> dict[str, Any]:
    """The `_component_` node of one source. Raises `UserError` naming the field to fix."""
    if form.kind not in KINDS:
        raise UserError(f"kind: {form.kind!r} is not one of {', '.join(KINDS)}")
    if form.kind == "preset":
        if form.preset not in PRESETS:
            raise UserError(f"preset: {form.preset!r} is unknown; use one of {', '.join(PRESETS)}")
        node: dict[str, Any] = {"_component_": f"engine.data.{form.preset}_dataset"}
        if form.source.strip():
            node["source"] = form.source.strip()
    else:
        if not form.source.strip():
            raise UserError(
                f"source: give a {'file path' if form.kind == 'local file' else 'Hub dataset id'}"
            )
        if form.builder not in BUILDERS:
            raise UserError(f"builder: {form.builder!r} is not one of {', '.join(BUILDERS)}")
        node = {"_component_": f"engine.data.{form.builder}_dataset", "source": form.source.strip()}
    if form.template.strip():
        node["template"] = form.template.strip()
    if form.chat_format.strip():
        node["chat_format"] = form.chat_format.strip()
    if form.column_map.strip():
        node["column_map"] = parse_column_map(form.column_map)
    if form.kind != "preset" or form.train_on_input:
        node["train_on_input"] = bool(form.train_on_input)
    if form.max_seq_len:
        node["max_seq_len"] = int(form.max_seq_len)
    node.update(form.extra)
    if not form.weight or form.weight <= 0:
        raise UserError(f"weight: {form.weight!r} must be a positive number")
    return node


def source_name(node: dict[str, Any], index: int) -> str:
    """A short, unique-enough name for `loss/<name>`: the preset or the file/Hub id's stem."""
    comp = str(node.get("_component_", "")).rsplit(".", 1)[-1].removesuffix("_dataset")
    src = node.get("source")
    if src and isinstance(src, str):
        stem = src.rstrip("/").rsplit("/", 1)[-1].split(".", 1)[0]
        return f"{stem}" if comp in BUILDERS else f"{comp}-{stem}"
    return comp or f"source{index}"


def mix_node(nodes: list[dict[str, Any]], weights: list[float]) -> dict[str, Any] | None:
    """The config's `dataset:` for the composed sources: one node as is, several as an
    `engine.data.mix` with their weights and names; None when there is no source."""
    if not nodes:
        return None
    if len(nodes) == 1:
        return dict(nodes[0])
    names = [source_name(n, i) for i, n in enumerate(nodes)]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            seen[name] += 1
            names[i] = f"{name}{seen[name]}"
        else:
            seen[name] = 0
    return {
        "_component_": "engine.data.mix",
        "weights": [float(w) for w in weights],
        "names": names,
        "datasets": [dict(n) for n in nodes],
    }
