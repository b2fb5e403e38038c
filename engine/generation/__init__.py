"""Text generation for the decoders: batched prompts of different lengths, a KV cache, greedy /
temperature / top-k / top-p sampling and per-row stop tokens (what GRPO rollouts and
`tunebench generate` use).

    from engine.generation import generate
    out = generate(model, [tok.encode("Hi", add_eos=False)], max_new_tokens=32,
                   stop_tokens=tok.stop_tokens, pad_id=tok.pad_id)
    text = tok.decode(out.completions[0])

Streaming: `on_step=TextStream(tok).on_step(print_piece)`; `should_stop=flag.is_set` ends it early.
"""

from engine.generation.batched_generate import GenerationError, GenerationOutput, generate, left_pad
from engine.generation.sampling import filter_logits, sample_next_token
from engine.generation.streaming import TextStream

__all__ = [
    "GenerationError",
    "GenerationOutput",
    "TextStream",
    "filter_logits",
    "generate",
    "left_pad",
    "sample_next_token",
]
