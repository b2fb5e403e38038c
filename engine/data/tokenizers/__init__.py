"""Tokenizers: `tokenizer.json` (tokenizers), SentencePiece `.model` and tiktoken files behind one
interface (`Tokenizer`), with BOS/EOS/pad handling, stop tokens and the model's Jinja chat template.

    from engine.data.tokenizers import load_tokenizer
    tok = load_tokenizer("path/to/model_dir")
    ids = tok.encode("Hello", add_bos=True, add_eos=False)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
"""

from engine.data.tokenizers.base import Tokenizer
from engine.data.tokenizers.chat_template import ChatTemplateError, render_chat_template
from engine.data.tokenizers.hf_json import HFTokenizer
from engine.data.tokenizers.hf_side_files import TokenizerFiles, read_tokenizer_files
from engine.data.tokenizers.loader import find_tokenizer_file, load_tokenizer
from engine.data.tokenizers.sentencepiece_model import SentencePieceTokenizer
from engine.data.tokenizers.tiktoken_model import LLAMA3_PATTERN, TiktokenTokenizer, llama3_special_tokens
from engine.data.tokenizers.tokenizer_errors import TokenizerError

__all__ = [
    "LLAMA3_PATTERN",
    "ChatTemplateError",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerFiles",
    "find_tokenizer_file",
    "llama3_special_tokens",
    "load_tokenizer",
    "read_tokenizer_files",
    "render_chat_template",
]
