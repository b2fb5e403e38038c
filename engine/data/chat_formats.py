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
Headers and prompts are masked; an assistant turn trains its content and its end-of-turn marker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from engine.data.errors import DataError
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
    """Interface: `units(messages) -> list[Unit]`. Subclasses are stateless and compare by type."""

    @abstractmethod
    def units(self, messages: list[Message], tokenizer) -> list[Unit]:
        """Lay out `messages` for `tokenizer` (a format may need its special tokens)."""

    def prompt_units(self, messages: list[Message], tokenizer) -> list[Unit]:
        """Units of a prompt that ends where the model's answer begins (for generation): the
        conversation so far plus the assistant header. Default: the conversation as laid out."""
        return self.units(messages, tokenizer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _plain_units(messages: list[Message], tokenizer) -> list[Unit]:
    # BOS only where the tokenizer itself prepends one (Llama, Mistral: yes; Qwen, SmolLM2: no).
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

    An assistant turn trains ``{content}<|im_end|>``; its header and the newline after are masked.
    """

    def units(self, messages, tokenizer):
        out = []
        for m in messages:
            head = f"<|im_start|>{m.role}\n"
            if m.role == "assistant":
                out.append(Unit().add(head, True).add(m.content + "<|im_end|>", m.masked).add("\n", True))
            else:
                out.append(Unit().add(head + m.content + "<|im_end|>\n", m.masked))
        return out

    def prompt_units(self, messages, tokenizer):
        return [*self.units(messages, tokenizer), Unit().add("<|im_start|>assistant\n", True)]


class Llama3ChatFormat(ChatFormat):
    """Llama 3: ``<|begin_of_text|>`` then per message
    ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``; the header is masked."""

    def units(self, messages, tokenizer):
        out = [Unit().add("<|begin_of_text|>", True)]
        for m in messages:
            role = "ipython" if m.role == "tool" else m.role
            head = f"<|start_header_id|>{role}<|end_header_id|>\n\n"
            out.append(Unit().add(head, True).add(m.content + "<|eot_id|>", m.masked))
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
    ``apply_chat_template(tokenize=True)`` does. Each trained turn (assistant turns; every turn with
    `train_on_input`) spans its content as found in the rendered text (templates may trim it) through
    the first end-of-turn token after it (the tokenizer's `stop_tokens`); headers stay masked. Raises `RowError` when the template drops or rewrites a message.
    Args:
      template_kwargs: extra template switches (e.g. ``{"enable_thinking": false}`` for Qwen3).
    """

    def __init__(self, template_kwargs: dict | None = None):
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
        unit = Unit()
        cursor = search = 0  # cursor: end of the text already placed in segments; search: scan start
        for k, m in enumerate(messages):
            body = m.content.strip()
            start = text.find(body, search) if body else search
            if start < 0:
                raise RowError(
                    "messages", f"the chat template rewrites turn {k}; use an explicit chat_format"
                )
            end = search = start + len(body)
            if not m.masked:
                ends = [(text.find(s, end), s) for s in stops]
                ends = [(p, s) for p, s in ends if p >= 0]
                if ends:
                    p, s = min(ends)
                    end = p + len(s)
                unit.add(text[cursor:start], True)
                unit.add(text[start:end], False)
                cursor = search = end
        unit.add(text[cursor:], True)
        return [unit]

    def prompt_units(self, messages, tokenizer):
        if getattr(tokenizer, "chat_template", None) is None:
            return self.units(messages, tokenizer)  # raises the no-template error
        dicts = [{"role": m.role, "content": m.content} for m in messages]
        text = tokenizer.apply_chat_template(dicts, add_generation_prompt=True, **self.template_kwargs)
        return [Unit().add(text, True)]

    def __repr__(self) -> str:
        return f"TokenizerChatTemplate({self.template_kwargs!r})"


CHAT_FORMATS = {
    "chatml": ChatMLFormat,
    "llama2": Llama2ChatFormat,
    "llama3": Llama3ChatFormat,
    "mistral": MistralChatFormat,
    "tokenizer": TokenizerChatTemplate,
    "plain": PlainFormat,
}


def resolve_chat_format(chat_format) -> ChatFormat:
    """A `ChatFormat` from an instance, a class, a dotted name (``engine.data.ChatMLFormat``), a short
    name (``chatml``, ``llama2``, ``llama3``, ``mistral``, ``tokenizer``, ``plain``) or None (plain)."""
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
