"""Data pipeline throughput: tokenisation (rows -> ids + loss masks) and packing, in samples/s.

    .venv/bin/python bench/data_pipeline.py [--repeats 3] [--tokenizer llama3] [--max-seq-len 2048]
        [--datasets alpaca-cleaned-1k,gsm8k-train] [--encode-threads auto,1]

Datasets: alpaca-cleaned-1k (Alpaca template) and GSM8K train (7,473 rows, question/answer template)
from ../shared/assets/data. Rows are read once; each timed run tokenizes them again with the cache off.
Reference: the transformers fast tokenizer batch-encoding the same prompt+response strings (ids only,
no loss masks), timed in the same process, interleaved with ours; the ratio is given by wall time
and by CPU time of the process (all its threads), the steadier figure on a shared machine. The tokenizer's one-time set-up
(for a rank-BPE tokenizer.json: building its tiktoken encoder) is timed apart, before the runs.
Every sample is checked: ids = [BOS] + the HF encoding of the same string + [EOS], and the loss mask
= the prompt-boundary method (encode the prompt alone, common prefix with the whole) — the number of
rows where either differs is printed. Prints a Markdown table (medians over `--repeats` runs) and the
packing efficiency (share of non-pad tokens). `--encode-threads` lists the tokenizer's
`encode_threads` settings to time ("auto" = one per usable CPU, up to 4), each interleaved with the
others and with the HF encode; one table row per setting. The machine line (CPU, flags, load average)
is printed before and after the runs.
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
sys.path.insert(0, str(REPO / "bench"))  # machine_info
ASSETS = REPO.parent / "shared" / "assets"


def _cpu_flags() -> str:
    """The CPU model and its SIMD flags (as the other bench/ scripts print them)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?"
    )
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    simd = [f for f in flags if f.startswith(("avx", "sse4", "amx", "fma"))]
    return f"{model}; {len(set(ln for ln in info.splitlines() if ln.startswith('processor')))} cpus; {' '.join(simd)}"


def _median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _prefix_mask(tok, prompt: str, body_ids: list[int], n_bos: int) -> list[bool]:
    """The loss mask by the prompt-boundary method: the prompt's tokens are the common prefix of the
    prompt's own encoding and the whole text's (BOS masked, response and EOS trained)."""
    alone = tok.encode(prompt, add_bos=False, add_eos=False)
    k = 0
    while k < min(len(alone), len(body_ids)) and alone[k] == body_ids[k]:
        k += 1
    return [True] * (n_bos + k) + [False] * (len(body_ids) - k + 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", default="llama3", help="folder name under ../shared/assets/tokenizers")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--num-proc", type=int, default=1, help="instruct_dataset's worker processes")
    ap.add_argument("--datasets", default="alpaca-cleaned-1k,gsm8k-train", help="comma-separated names")
    ap.add_argument(
        "--encode-threads", default="auto", help="comma-separated encode_threads settings: auto or a number"
    )
    args = ap.parse_args(argv)
    try:
        settings = [None if t.strip() == "auto" else int(t) for t in args.encode_threads.split(",")]
    except ValueError:
        print(f"--encode-threads: expected e.g. auto,1; got {args.encode_threads!r}", file=sys.stderr)
        return 2
    if not ASSETS.is_dir():
        print(
            f"bench/data_pipeline.py: {ASSETS} is absent; the benchmark needs the shared assets",
            file=sys.stderr,
        )
        return 2

    from machine_info import machine_line
    from transformers import AutoTokenizer

    from engine.data import PackedDataset, instruct_dataset
    from engine.data.sources import load_rows
    from engine.data.templates import AlpacaInstructTemplate, QuestionAnswerTemplate
    from engine.data.tokenizers import load_tokenizer

    tok_dir = ASSETS / "tokenizers" / args.tokenizer
    tok = load_tokenizer(tok_dir)
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    t0 = time.perf_counter()
    fast = bool(getattr(tok, "_fast_encoder", lambda: False)())  # built here, not inside the first run
    setup_s = time.perf_counter() - t0
    sets = [
        ("alpaca-cleaned-1k", ASSETS / "data/alpaca_data_cleaned_1000.json", AlpacaInstructTemplate(), {}),
        ("gsm8k-train", ASSETS / "data/gsm8k_train.jsonl", QuestionAnswerTemplate(), {"output": "answer"}),
    ]
    wanted = [n.strip() for n in args.datasets.split(",")]
    unknown = sorted(set(wanted) - {name for name, *_ in sets})
    if unknown:
        print(
            f"--datasets: unknown {', '.join(unknown)}; choose from alpaca-cleaned-1k, gsm8k-train",
            file=sys.stderr,
        )
        return 2
    sets = [s for s in sets if s[0] in wanted]
    start_line = machine_line()
    lines = [
        f"Tokenizer: {args.tokenizer} ({'tiktoken encoder' if fast else 'tokenizers library'}, one-time set-up "
        f"{setup_s:.2f} s); pack length {args.max_seq_len}; num_proc {args.num_proc}; medians of {args.repeats} runs.",
        f"Before: {start_line}",
        "",
        "| dataset | encode_threads | rows | tokens | tokenize (samples/s) | HF batch encode, ids only (samples/s) "
        "| ratio (wall) | ratio (CPU time) | ids = HF | masks = prefix method | pack (samples/s) "
        "| packing efficiency |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, path, template, cmap in sets:
        rows = load_rows(str(path))
        out_col = cmap.get("output", "output")
        prompts = [template.format(r) for r in rows]
        texts = [p + r[out_col] for p, r in zip(prompts, rows)]
        t_tok = {t: [] for t in settings}
        c_tok = {t: [] for t in settings}
        t_hf, c_hf, built = [], [], {}
        for _ in range(args.repeats):  # interleaved, so every side sees the same machine load
            for threads in settings:
                tok.encode_threads = threads
                c0, t0 = time.process_time(), time.perf_counter()
                built[threads] = instruct_dataset(
                    tok,
                    source=rows,
                    template=template,
                    column_map=cmap or None,
                    cache=False,
                    num_proc=args.num_proc,
                )
                t_tok[threads].append(time.perf_counter() - t0)
                c_tok[threads].append(time.process_time() - c0)
            c0, t0 = time.process_time(), time.perf_counter()
            hf_ids = hf(texts, add_special_tokens=False)["input_ids"]
            t_hf.append(time.perf_counter() - t0)
            c_hf.append(time.process_time() - c0)
        med_hf, med_c_hf = statistics.median(t_hf), statistics.median(c_hf)
        bos = [tok.bos_id] if tok.adds_bos else []
        n = len(rows)
        for threads in settings:
            ds = built[threads]
            med_tok = statistics.median(t_tok[threads])
            c_ratio = med_c_hf / statistics.median(c_tok[threads])
            ids_bad = sum(ds[i]["tokens"] != bos + hf_ids[i] + [tok.eos_id] for i in range(len(rows)))
            mask_bad = sum(
                ds.mask(i) != _prefix_mask(tok, prompt, ids, len(bos))
                for i, (prompt, ids) in enumerate(zip(prompts, hf_ids))
            )
            t_pack, packed = _median_time(
                lambda ds=ds: PackedDataset(ds, max_seq_len=args.max_seq_len), args.repeats
            )
            lines.append(
                f"| {name} | {'auto' if threads is None else threads} | {n} | {int(ds.lengths.sum())} "
                f"| {n / med_tok:,.0f} | {n / med_hf:,.0f} | {med_hf / med_tok:.2f}x | {c_ratio:.2f}x "
                f"| {n - ids_bad}/{n} | {n - mask_bad}/{n} | {n / t_pack:,.0f} | {packed.efficiency:.3f} |"
            )
    lines += ["", f"After: {machine_line()}"]
    print("\n".join(lines))
    print(
        json.dumps({"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0], "cpu": _cpu_flags()})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
