"""Chat formats: how a conversation is laid out in text for one model family.

A format turns ``list[Message]`` into `Unit`s. A unit is one piece of text that is encoded in one
tokenizer call (exactly as the format's reference implementation encodes it) with optional BOS/EOS
ids around it; its `Segment`s only say which characters are excluded from the loss. Splitting text
into separately encoded units matters for SentencePiece tokenizers, which add a leading-space piece at
the start of every call: Llama 2 encodes each [INST] exchange on its own, Mistral each instruction and
each answer.

Formats (all component-usable, e.g. ``chat_format: engine.data.ChatMLFormat``):
  `ChatMLFormat`        ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` (Qwen, SmolLM2, ...)
  `Llama2ChatFormat`    ``<s>[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{user} [/INST] {answer} </s>``
  `Llama3ChatFormat`    ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``
  `MistralChatFormat`   ``<s>[INST] {user} [/INST]{answer}</s>`` (v1 layout, answer encoded alone)
  `TokenizerChatTemplate`  the tokenizer's own Jinja chat template (``tokenizer_config.json``)

Labels (torchtune 0.6.1's layout, so a tunebench run and a torchtune run on the same rows train the
same tokens): every token of a turn -- its header, content and end-of-turn marker -- takes the turn's
mask (`Message.masked`); BOS is masked. ``mask_headers=True`` (an argument of every format and of the
dataset builders) masks the role headers of trained turns as well (Llama 3
``<|start_header_id|>assistant<|end_header_id|>\\n\\n``, ChatML ``<|im_start|>assistant\\n`` and the
newline after ``<|im_end|>``), so only content and end-of-turn markers are trained. Llama 2 and
Mistral have no role headers: their ``[INST] ... [/INST]`` belongs to the (masked) user turn.
Tested against torchtune 0.6.1 itself and Meta's layout in tests/engine/data/test_torchtune_parity.py.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from engine.data.data_errors import DataError
from engine.data.messages import Message, RowError


@dataclass
class Segment:
    """Text inside a unit; `masked=True` keeps its tokens out of the loss."""

    text: str
    masked: bool


@dataclass
class Unit:
    """Text encoded in one call, with `bos`/`eos` ids added around it when set."""

    segments: list[Segment] = field(default_factory=list)
    bos: bool = False
    eos: bool = False
    eos_masked: bool = False

    def add(self, text: str, masked: bool) -> Unit:
        if text:
            self.segments.append(Segment(text, masked))
        return self


class ChatFormat(ABC):
    """Interface: `units(messages) -> list[Unit]`.

    Args:
      mask_headers: mask the role headers of trained turns too (default False: a trained turn trains
        its header, as torchtune does). Formats without role headers ignore it.
    """

    def __init__(self, mask_headers: bool = False):
        if not isinstance(mask_headers, bool):
            raise DataError(f"mask_headers: must be true or false, got {mask_headers!r}")
        self.mask_headers = mask_headers

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(type(self))

    @abstractmethod
    def units(self, messages: list[Message], tokenizer) -> list[Unit]:
        """Lay out `messages` for `tokenizer` (a format may need its special tokens)."""

    def prompt_units(self, messages: list[Message], tokenizer) -> list[Unit]:
        """Units of a prompt that ends where the model's answer begins (for generation): the
        conversation so far plus the assistant header. Default: the conversation as laid out."""
        return self.units(messages, tokenizer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mask_headers={self.mask_headers})"


def _plain_units(messages: list[Message], tokenizer) -> list[Unit]:
    # BOS where the model's tokenizer starts sequences with one (Llama 2/3, Mistral: yes; Qwen,
    # SmolLM2: no); `encode_unit` never doubles a BOS the text already starts with.
    unit = Unit(bos=bool(getattr(tokenizer, "adds_bos", True)), eos=True)
    for m in messages:
        unit.add(m.content, m.masked)
    unit.eos_masked = bool(messages) and messages[-1].masked
    return [unit]


class PlainFormat(ChatFormat):
    """No chat wrapping: BOS, the messages' texts back to back, EOS (instruct templates, plain text)."""

    def units(self, messages, tokenizer):
        return _plain_units(messages, tokenizer)

    def prompt_units(self, messages, tokenizer):
        unit = _plain_units(messages, tokenizer)[0]
        unit.eos = False
        return [unit]


class ChatMLFormat(ChatFormat):
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, no BOS/EOS ids.

    Each message's tokens take its mask (header, content, ``<|im_end|>`` and the newline after); the
    newline after the last message is masked (torchtune ends a sample at ``<|im_end|>``; the
    published layout, as Qwen's template renders it, has the newline). ``mask_headers`` masks
    ``<|im_start|>{role}\\n`` and that newline in every turn.
    """

    def units(self, messages, tokenizer):
        out = []
        for k, m in enumerate(messages):
            last = k == len(messages) - 1
            unit = Unit().add(f"<|im_start|>{m.role}\n", m.masked or self.mask_headers)
            unit.add(m.content + "<|im_end|>", m.masked)
            out.append(unit.add("\n", m.masked or self.mask_headers or last))
        return out

    def prompt_units(self, messages, tokenizer):
        return [*self.units(messages, tokenizer), Unit().add("<|im_start|>assistant\n", True)]


class Llama3ChatFormat(ChatFormat):
    """Llama 3, as Meta's reference `ChatFormat` encodes a dialog: ``<|begin_of_text|>`` then per
    message ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content.strip()}<|eot_id|>``.

    Each message's tokens take its mask (header included; ``mask_headers`` masks the header). Unlike
    torchtune, no ``<|end_of_text|>`` follows the last turn (Meta's dialog has none)."""

    def units(self, messages, tokenizer):
        out = [Unit().add("<|begin_of_text|>", True)]
        for m in messages:
            role = "ipython" if m.role == "tool" else m.role
            head = f"<|start_header_id|>{role}<|end_header_id|>\n\n"
            unit = Unit().add(head, m.masked or self.mask_headers)
            out.append(unit.add(m.content.strip() + "<|eot_id|>", m.masked))
        return out

    def prompt_units(self, messages, tokenizer):
        head = "<|start_header_id|>assistant<|end_header_id|>\n\n"
        return [*self.units(messages, tokenizer), Unit().add(head, True)]


def _exchanges(messages: list[Message], name: str) -> tuple[str | None, list[tuple[Message, Message | None]]]:
    """Split into (system text, [(user, assistant | None), ...]) for [INST]-style formats."""
    msgs = list(messages)
    system = None
    if msgs and msgs[0].role == "system":
        system = msgs.pop(0).content
    pairs = []
    i = 0
    while i < len(msgs):
        user = msgs[i]
        if user.role != "user":
            raise RowError(
                "messages", f"{name} needs user/assistant turns in alternation; turn {i} is {user.role}"
            )
        answer = msgs[i + 1] if i + 1 < len(msgs) else None
        if answer is not None and answer.role != "assistant":
            raise RowError(
                "messages", f"{name} needs user/assistant turns in alternation; turn {i + 1} is {answer.role}"
            )
        pairs.append((user, answer))
        i += 2
    return system, pairs


class Llama2ChatFormat(ChatFormat):
    """Llama 2 chat, as Meta's reference `chat_completion` encodes it: each exchange is one call,
    ``BOS + "[INST] {user} [/INST] {answer} " + EOS`` with contents stripped, the system prompt inside
    the first instruction as ``<<SYS>>\\n{system}\\n<</SYS>>\\n\\n``. The answer part is trained."""

    def units(self, messages, tokenizer):
        system, pairs = _exchanges(messages, "Llama2ChatFormat")
        out = []
        for k, (user, answer) in enumerate(pairs):
            text = user.content.strip()
            if k == 0 and system is not None:
                text = f"<<SYS>>\n{system.strip()}\n<</SYS>>\n\n{text}"
            unit = Unit(bos=True).add(f"[INST] {text} [/INST]", user.masked)
            if answer is not None:
                unit.add(f" {answer.content.strip()} ", answer.masked)
                unit.eos, unit.eos_masked = True, answer.masked
            out.append(unit)
        return out


class MistralChatFormat(ChatFormat):
    """Mistral instruct (v1 layout): ``BOS [INST] {user} [/INST]{answer}EOS[INST] ...``; every
    instruction and every answer is encoded on its own (so a SentencePiece tokenizer puts a word
    boundary before the answer). There is no system role: a system prompt is prefixed to the first
    instruction with a blank line."""

    def units(self, messages, tokenizer):
        system, pairs = _exchanges(messages, "MistralChatFormat")
        out = []
        for k, (user, answer) in enumerate(pairs):
            text = user.content
            if k == 0 and system is not None:
                text = f"{system}\n\n{text}"
            out.append(Unit(bos=k == 0).add(f"[INST] {text} [/INST]", user.masked))
            if answer is not None:
                out.append(Unit(eos=True, eos_masked=answer.masked).add(answer.content, answer.masked))
        return out


class TokenizerChatTemplate(ChatFormat):
    """The tokenizer's own Jinja chat template (``chat_template`` in ``tokenizer_config.json``).

    The whole conversation is rendered once and encoded in one call, exactly as
    ``apply_chat_template(tokenize=True)`` does. Each turn's text is found in the rendering: its
    content (templates may trim it) through the first end-of-turn token after it (the tokenizer's
    `stop_tokens`) and the whitespace after that; its header is the text between the previous turn
    and its content (a BOS the template writes first stays masked). A trained turn trains header,
    content and end marker, or with ``mask_headers`` its content and end marker only. Raises
    `RowError` when the template drops or rewrites a message.
    Args:
      template_kwargs: extra template switches (e.g. ``{"enable_thinking": false}`` for Qwen3).
      mask_headers: see `ChatFormat`.
    """

    def __init__(self, template_kwargs: dict | None = None, mask_headers: bool = False):
        super().__init__(mask_headers)
        self.template_kwargs = dict(template_kwargs or {})

    def units(self, messages, tokenizer):
        if getattr(tokenizer, "chat_template", None) is None:
            raise DataError(
                f"{getattr(tokenizer, 'source', 'tokenizer')}: has no chat template; set chat_format to one of "
                "engine.data.ChatMLFormat, Llama3ChatFormat, Llama2ChatFormat, MistralChatFormat"
            )
        dicts = [{"role": m.role, "content": m.content} for m in messages]
        text = tokenizer.apply_chat_template(dicts, add_generation_prompt=False, **self.template_kwargs)
        stops = [tokenizer.id_to_token(i) for i in getattr(tokenizer, "stop_tokens", [])]
        stops = [s for s in stops if s]
        bos_id = getattr(tokenizer, "bos_id", None)
        bos = tokenizer.id_to_token(bos_id) if bos_id is not None else None
        unit = Unit()
        cursor = 0  # end of the text already placed in segments
        if bos and text.startswith(bos):
            unit.add(bos, True)
            cursor = len(bos)
        for k, m in enumerate(messages):
            body = m.content.strip()
            start = text.find(body, cursor) if body else cursor
            if start < 0:
                raise RowError(
                    "messages", f"the chat template rewrites turn {k}; use an explicit chat_format"
                )
            end = start + len(body)
            ends = [(p, s) for p, s in ((text.find(s, end), s) for s in stops) if p >= 0]
            if ends:
                p, s = min(ends)
                end = p + len(s)
            turn_end = end
            while turn_end < len(text) and text[turn_end].isspace():
                turn_end += 1
            head_masked = m.masked or self.mask_headers
            unit.add(text[cursor:start], head_masked)
            unit.add(text[start:end], m.masked)
            unit.add(text[end:turn_end], head_masked or k == len(messages) - 1)
            cursor = turn_end
        unit.add(text[cursor:], True)
        return [unit]

    def prompt_units(self, messages, tokenizer):
        if getattr(tokenizer, "chat_template", None) is None:
            return self.units(messages, tokenizer)  # raises the no-template error
        dicts = [{"role": m.role, "content": m.content} for m in messages]
        text = tokenizer.apply_chat_template(dicts, add_generation_prompt=True, **self.template_kwargs)
        return [Unit().add(text, True)]

    def __repr__(self) -> str:
        return f"TokenizerChatTemplate({self.template_kwargs!r}, mask_headers={self.mask_headers})"


CHAT_FORMATS = {
    "chatml": ChatMLFormat,
    "llama2": Llama2ChatFormat,
    "llama3": Llama3ChatFormat,
    "mistral": MistralChatFormat,
    "tokenizer": TokenizerChatTemplate,
    "plain": PlainFormat,
}


def resolve_chat_format(chat_format, mask_headers: bool | None = None) -> ChatFormat:
    """A `ChatFormat` from an instance, a class, a dotted name (``engine.data.ChatMLFormat``), a short
    name (``chatml``, ``llama2``, ``llama3``, ``mistral``, ``tokenizer``, ``plain``) or None (plain).
    `mask_headers` (when not None) overrides the format's own setting."""
    fmt = _resolve(chat_format)
    if mask_headers is not None and mask_headers != fmt.mask_headers:
        if not isinstance(mask_headers, bool):
            raise DataError(f"mask_headers: must be true or false, got {mask_headers!r}")
        fmt = copy.copy(fmt)
        fmt.mask_headers = mask_headers
    return fmt


def _resolve(chat_format) -> ChatFormat:
    if chat_format is None:
        return PlainFormat()
    if isinstance(chat_format, ChatFormat):
        return chat_format
    if isinstance(chat_format, type) and issubclass(chat_format, ChatFormat):
        return chat_format()
    if isinstance(chat_format, str):
        name = chat_format.removeprefix("engine.data.")
        import engine.data as data_pkg

        cls = CHAT_FORMATS.get(name.lower()) or getattr(data_pkg, name, None)
        if isinstance(cls, type) and issubclass(cls, ChatFormat):
            return cls()
    known = ", ".join(CHAT_FORMATS)
    raise DataError(
        f"chat_format: {chat_format!r} is not a chat format; use one of {known} or engine.data.<Name>Format"
    )
