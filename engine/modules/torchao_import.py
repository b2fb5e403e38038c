"""Import torchao without its CPU noise.

On a CPU-only machine `import torchao` logs one "Failed to load .../_C_mxfp8...so" /
"_C_cutlass_90a" warning per optional CUDA kernel library, and torch's pytree logs a deprecation
warning for an Enum torchao registers; on every run, in every rank's log. `import_torchao` adds a
filter (once) to those two public loggers that drops exactly these records, then imports the module;
every other torchao message still shows. Every tunebench import of torchao goes through here.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

_INSTALLED = False


class _TorchaoNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if record.name == "torchao":
            return not (msg.startswith("Failed to load") and "/torchao/_C" in msg)
        return "is an Enum subclass and is now natively supported" not in msg


def import_torchao(module: str = "torchao") -> ModuleType:
    """`importlib.import_module(module)` (a torchao module) with the filter in place."""
    global _INSTALLED
    if not _INSTALLED:
        _INSTALLED = True
        noise = _TorchaoNoise()
        logging.getLogger("torchao").addFilter(noise)
        logging.getLogger("torch.utils._pytree").addFilter(noise)
    return importlib.import_module(module)
