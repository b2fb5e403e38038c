"""Streaming generation: the text pieces handed out while generating concatenate to the decoded
non-streamed completion (greedy, so both runs pick the same tokens), the streamed tokens and text equal
transformers' greedy `generate` on the same weights decoded by the `tokenizers` library (a reference
that is not our code), characters split across tokens come out whole, and `should_stop` ends
generation early with the tokens so far."""

from __future__ import annotations

import pytest
import torch

from engine.data.tokenizers import load_tokenizer
from engine.generation import TextStream, generate
from engine.models import from_pretrained
from tests.engine.generation.tiny_chat_model import make_chat_model_dir

QUESTIONS = ["Hi", "what is two plus two?", "tell me about the cat", "café?"]


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    return make_chat_model_dir(tmp_path_factory.mktemp("stream") / "model")


@pytest.fixture(scope="module")
def chat(chat_folder):
    return from_pretrained(chat_folder, dtype=torch.float32), load_tokenizer(chat_folder)


def _prompt(tok, question: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )


@pytest.mark.parametrize("question", QUESTIONS)
def test_streamed_pieces_concatenate_to_the_greedy_completion(chat, question):
    model, tok = chat
    ids = _prompt(tok, question)
    kwargs = dict(max_new_tokens=40, stop_tokens=tok.stop_tokens, pad_id=tok.pad_id)
    plain = generate(model, [ids], **kwargs)
    stream, pieces, seen = TextStream(tok), [], []

    def on_step(tokens, running):
        seen.append(int(tokens[0]))
        hand_out(tokens, running)

    hand_out = stream.on_step(pieces.append)
    streamed = generate(model, [ids], on_step=on_step, **kwargs)
    rest = stream.finish()
    assert rest is not None
    assert seen == plain.completions[0] == streamed.completions[0] == stream.ids
    assert "".join(pieces) + rest == tok.decode(plain.completions[0], skip_special_tokens=True)
    assert len(pieces) > 1  # handed out as it grew, not at the end


@pytest.mark.parametrize("question", QUESTIONS[1:3])
def test_streamed_tokens_and_text_equal_transformers_greedy(chat, chat_folder, question):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    model, tok = chat
    ids = _prompt(tok, question)
    stream, pieces = TextStream(tok), []
    out = generate(model, [ids], max_new_tokens=24, on_step=stream.on_step(pieces.append))
    rest = stream.finish()
    ref = transformers.AutoModelForCausalLM.from_pretrained(chat_folder, dtype=torch.float32).eval()
    prompt = torch.tensor([ids])
    expected = ref.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=tok.pad_id,
    )[0, len(ids) :].tolist()
    assert len(expected) == 24 and stream.ids == out.completions[0] == expected
    reference_text = Tokenizer.from_file(str(chat_folder / "tokenizer.json")).decode(expected)
    assert "".join(pieces) + rest == reference_text and len(pieces) > 1


class _Bytes:
    """A tokenizer whose ids are bytes: UTF-8 characters span several ids (decoded with replacement)."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_split_characters_come_out_whole():
    stream = TextStream(_Bytes())
    pieces = [stream.push(b) for b in "aé東b".encode()]
    # a, then nothing until é's second byte, nothing until 東's third byte, then b
    assert pieces == ["a", "", "é", "", "", "東", "b"]
    assert stream.finish() == "" and stream.text == "aé東b"
    broken = TextStream(_Bytes())
    assert (
        broken.push(0xE6) == "" and broken.finish() == "\ufffd"
    )  # an unfinished char at the end still shows


def test_should_stop_ends_generation_with_the_tokens_so_far(chat):
    model, tok = chat
    ids = _prompt(tok, "what is two plus two?")
    full = generate(model, [ids], max_new_tokens=30)  # no stop tokens: all 30 steps
    steps = []
    out = generate(
        model,
        [ids],
        max_new_tokens=30,
        on_step=lambda t, r: steps.append(1),
        should_stop=lambda: len(steps) >= 4,
    )
    assert out.lengths.tolist() == [4] and not bool(out.stopped[0])
    assert out.completions[0] == full.completions[0][:4]
    # the caches were torn down: the next call is unaffected
    assert generate(model, [ids], max_new_tokens=30).completions == full.completions
