"""The line every CPU figure in bench/ is printed with: CPU model, SIMD flags, cores and load average
(these machines are shared and noisy). Imported by the bench scripts, which run as `python bench/X.py`."""

from __future__ import annotations

import os
from pathlib import Path


def machine_line() -> str:
    """CPU model, the SIMD flags that matter, core count and load average (the figures are noisy)."""
    model, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = " ".join(f for f in ("sse4_2", "avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"CPU: {model}, {os.cpu_count()} cores, flags: {simd or '-'}; load average {load}"
