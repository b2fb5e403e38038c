"""torchao imported through tunebench logs none of its optional-kernel "Failed to load" lines."""

import logging
import subprocess
import sys

import pytest

from engine.modules.torchao_import import _TorchaoNoise


def test_the_filter_drops_only_the_kernel_library_lines():
    def rec(name, msg):
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)

    f = _TorchaoNoise()
    so = "/x/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
    assert not f.filter(rec("torchao", f"Failed to load {so}: Could not load this library: {so}"))
    assert f.filter(rec("torchao", "Failed to load config.json"))  # not a kernel library: kept
    assert f.filter(rec("torchao", "Skipping import of cpp extensions due to incompatible torch version"))
    assert not f.filter(rec("torch.utils._pytree", "<enum 'KernelPreference'> is an Enum subclass and is now "
                            "natively supported by torch.compile as an opaque value type."))  # fmt: skip
    assert f.filter(rec("torch.utils._pytree", "something else"))


def test_nf4_import_is_quiet():
    pytest.importorskip("torchao")
    code = (
        "import torch\n"
        "from engine.modules.peft.lora import to_nf4\n"
        "to_nf4(torch.randn(64, 64))\n"
        "import logging; logging.getLogger('torchao').warning('other torchao warnings still show')\n"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stderr
    assert "Failed to load" not in err and "is an Enum subclass" not in err, err
    assert "other torchao warnings still show" in err
