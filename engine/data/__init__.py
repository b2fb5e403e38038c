"""The data pipeline: rows -> messages -> token ids + loss masks -> (mixed, packed) batches.

    from engine.data import build_dataset, padded_collate
    ds = build_dataset(cfg["dataset"], tokenizer)        # one node, a list (concatenation) or a mix
    batch = padded_collate([ds[0], ds[1]], pad_id=tokenizer.pad_id)

Samples: ``{"tokens", "labels" (already shifted, -100 = ignored), "source_id"}``; see
docs/ARCHITECTURE.md ("Data") for the batch layouts. Tokenizers live in `engine.data.tokenizers`.
"""

from engine.data.builders import (
    ConversationToMessages,
    chat_dataset,
    instruct_dataset,
    preference_dataset,
    text_completion_dataset,
)
from engine.data.chat_formats import (
    ChatFormat,
    ChatMLFormat,
    Llama2ChatFormat,
    Llama3ChatFormat,
    MistralChatFormat,
    PlainFormat,
    TokenizerChatTemplate,
    resolve_chat_format,
)
from engine.data.collate import packed_collate, padded_collate, padded_collate_dpo
from engine.data.data_errors import DataError
from engine.data.dataset import PreferenceDataset, TokenizedDataset
from engine.data.demo import (
    demo_dataset,
    demo_heldout_rows,
    demo_preference_dataset,
    demo_preference_rows,
    demo_rows,
    demo_unpaired_dataset,
    extract_answer,
)
from engine.data.filters import ColumnFilter
from engine.data.messages import (
    AlpacaToMessages,
    ChosenRejectedToMessages,
    InputOutputToMessages,
    Message,
    OpenAIToMessages,
    RowError,
    ShareGPTToMessages,
    TextToMessages,
    apply_column_map,
)
from engine.data.mixes import ConcatDataset, WeightedMixDataset, build_dataset, mix
from engine.data.packing import PackedDataset
from engine.data.presets import (
    alpaca_cleaned_dataset,
    alpaca_dataset,
    grammar_dataset,
    gsm8k_dataset,
    hh_rlhf_dataset,
    samsum_dataset,
    slimorca_dataset,
    stack_exchange_paired_dataset,
    wikitext_dataset,
)
from engine.data.preview import SamplePreview, length_stats, preview_sample
from engine.data.prompts import PromptDataset, demo_prompt_dataset, prompt_collate, prompt_dataset
from engine.data.templates import (
    AlpacaInstructTemplate,
    ChatMLTemplate,
    GrammarErrorCorrectionTemplate,
    InstructTemplate,
    PromptTemplate,
    PromptTemplateInterface,
    QuestionAnswerTemplate,
    StackExchangedPairedTemplate,
    SummarizeTemplate,
)
from engine.data.tokenize import (
    IGNORE_INDEX,
    shifted_labels,
    tokenize_messages,
    tokenize_messages_batch,
    tokenize_prompt,
)
from engine.data.unpaired import UnpairedDataset, padded_collate_unpaired, unpaired_dataset

__all__ = [
    "IGNORE_INDEX",
    "AlpacaInstructTemplate",
    "ChatMLTemplate",
    "AlpacaToMessages",
    "ChatFormat",
    "ChatMLFormat",
    "ChosenRejectedToMessages",
    "ColumnFilter",
    "ConcatDataset",
    "ConversationToMessages",
    "DataError",
    "GrammarErrorCorrectionTemplate",
    "InputOutputToMessages",
    "InstructTemplate",
    "Llama2ChatFormat",
    "Llama3ChatFormat",
    "Message",
    "MistralChatFormat",
    "OpenAIToMessages",
    "PackedDataset",
    "PlainFormat",
    "PreferenceDataset",
    "PromptDataset",
    "PromptTemplate",
    "PromptTemplateInterface",
    "QuestionAnswerTemplate",
    "RowError",
    "SamplePreview",
    "ShareGPTToMessages",
    "StackExchangedPairedTemplate",
    "SummarizeTemplate",
    "TextToMessages",
    "TokenizedDataset",
    "TokenizerChatTemplate",
    "WeightedMixDataset",
    "alpaca_cleaned_dataset",
    "alpaca_dataset",
    "apply_column_map",
    "build_dataset",
    "chat_dataset",
    "demo_dataset",
    "demo_heldout_rows",
    "demo_preference_dataset",
    "demo_preference_rows",
    "demo_prompt_dataset",
    "demo_rows",
    "demo_unpaired_dataset",
    "extract_answer",
    "grammar_dataset",
    "gsm8k_dataset",
    "hh_rlhf_dataset",
    "instruct_dataset",
    "length_stats",
    "mix",
    "packed_collate",
    "padded_collate",
    "padded_collate_dpo",
    "preference_dataset",
    "preview_sample",
    "prompt_collate",
    "prompt_dataset",
    "resolve_chat_format",
    "samsum_dataset",
    "shifted_labels",
    "slimorca_dataset",
    "stack_exchange_paired_dataset",
    "text_completion_dataset",
    "tokenize_messages",
    "tokenize_messages_batch",
    "tokenize_prompt",
    "unpaired_dataset",
    "UnpairedDataset",
    "padded_collate_unpaired",
    "wikitext_dataset",
]
