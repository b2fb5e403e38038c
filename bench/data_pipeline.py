"""Data pipeline throughput: tokenisation (rows -> ids + loss masks) and packing, in samples/s.

    .venv/bin/python bench/data_pipeline.py [--repeats 3] [--tokenizer llama3] [--max-seq-len 2048]

Datasets: alpaca-cleaned-1k (Alpaca template) and GSM8K train (7,473 rows, question/answer template)
from ../shared/assets/data. Rows are read once; each timed run tokenizes them again with the cache off.
Reference row: the transformers fast tokenizer batch-encoding the same prompt+response strings
(ids only, no loss masks) — the floor cost of the tokenizer itself. Prints a Markdown table
(medians over `--repeats` runs) and the packing efficiency (share of non-pad tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ASSETS = REPO.parent / "shared" / "assets"


def _median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", default="llama3", help="folder name under ../shared/assets/tokenizers")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    args = ap.parse_args(argv)
    if not ASSETS.is_dir():
        print(
            f"bench/data_pipeline.py: {ASSETS} is absent; the benchmark needs the shared assets",
            file=sys.stderr,
        )
        return 2

    from transformers import AutoTokenizer

    from engine.data import PackedDataset, instruct_dataset
    from engine.data.sources import load_rows
    from engine.data.templates import AlpacaInstructTemplate, QuestionAnswerTemplate
    from engine.data.tokenizers import load_tokenizer

    tok_dir = ASSETS / "tokenizers" / args.tokenizer
    tok = load_tokenizer(tok_dir)
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    sets = [
        ("alpaca-cleaned-1k", ASSETS / "data/alpaca_data_cleaned_1000.json", AlpacaInstructTemplate(), {}),
        ("gsm8k-train", ASSETS / "data/gsm8k_train.jsonl", QuestionAnswerTemplate(), {"output": "answer"}),
    ]
    lines = [
        f"Tokenizer: {args.tokenizer}; pack length {args.max_seq_len}; medians of {args.repeats} runs.",
        "",
        "| dataset | rows | tokens | tokenize (samples/s) | HF batch encode, ids only (samples/s) | ratio | pack (samples/s) | packing efficiency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, path, template, cmap in sets:
        rows = load_rows(str(path))
        t_tok, ds = _median_time(
            lambda rows=rows, template=template, cmap=cmap: instruct_dataset(
                tok, source=rows, template=template, column_map=cmap or None, cache=False
            ),
            args.repeats,
        )
        out_col = cmap.get("output", "output")
        texts = [template.format(r) + r[out_col] for r in rows]
        t_hf, _ = _median_time(
            lambda texts=texts: hf(texts, add_special_tokens=True)["input_ids"], args.repeats
        )
        t_pack, packed = _median_time(
            lambda ds=ds: PackedDataset(ds, max_seq_len=args.max_seq_len), args.repeats
        )
        n = len(rows)
        lines.append(
            f"| {name} | {n} | {int(ds.lengths.sum())} | {n / t_tok:,.0f} | {n / t_hf:,.0f} | {t_hf / t_tok:.2f}x "
            f"| {n / t_pack:,.0f} | {packed.efficiency:.3f} |"
        )
    print("\n".join(lines))
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
