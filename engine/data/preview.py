"""What the workbench shows of a dataset: one sample as text with its loss-masked spans marked,
and token-length statistics for a whole source."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.data.tokenize import IGNORE_INDEX


@dataclass
class SamplePreview:
    """One sample as text. `segments` are ``(text, masked)`` runs in order (masked = not trained);
    `num_tokens` / `num_trained` count tokens; `source` is the sample's source name."""

    segments: list[tuple[str, bool]] = field(default_factory=list)
    num_tokens: int = 0
    num_trained: int = 0
    source: str = ""

    def render(self, masked_open: str = "[", masked_close: str = "]") -> str:
        """Plain text with masked runs wrapped in the given markers."""
        return "".join(f"{masked_open}{t}{masked_close}" if m else t for t, m in self.segments)


def trained_flags(tokens: list[int], labels: list[int]) -> list[bool]:
    """Per token: is it a training target? Token j is trained when position j-1 predicts it
    (labels are already shifted), so the first token is never trained."""
    return [False] + [labels[j - 1] != IGNORE_INDEX for j in range(1, len(tokens))]


def preview_sample(ds, index: int, tokenizer) -> SamplePreview:
    """Sample `index` of `ds` (any dataset in engine.data; preference pairs show the chosen side)
    decoded into ``(text, masked)`` runs. Special tokens are shown."""
    s = ds[index]
    tokens = s.get("tokens", s.get("chosen_tokens"))
    labels = s.get("labels", s.get("chosen_labels"))
    trained = trained_flags(tokens, labels)
    segments: list[tuple[str, bool]] = []
    start = 0
    for j in range(1, len(tokens) + 1):
        if j == len(tokens) or trained[j] != trained[start]:
            segments.append(
                (tokenizer.decode(tokens[start:j], skip_special_tokens=False), not trained[start])
            )
            start = j
    names = getattr(ds, "source_names", [""])
    sid = int(s.get("source_id", 0))
    return SamplePreview(
        segments=segments,
        num_tokens=len(tokens),
        num_trained=sum(trained),
        source=names[sid] if 0 <= sid < len(names) else "",
    )


def length_stats(ds) -> dict[str, float]:
    """Token-length statistics of a dataset: ``count``, ``mean``, ``p50``, ``p95``, ``max``, ``total``."""
    lengths = getattr(ds, "lengths", None)
    if lengths is None:
        lengths = [len(ds[i].get("tokens", ds[i].get("chosen_tokens", []))) for i in range(len(ds))]
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.size == 0:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0, "total": 0}
    return {
        "count": int(arr.size),
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "max": int(arr.max()),
        "total": int(arr.sum()),
    }
