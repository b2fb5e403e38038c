"""Every built-in config under configs/ opens with its launch line and validates clean."""

import pytest

from engine.config import list_builtin_configs
from engine.config._validate import validate_file

BUILTIN = list_builtin_configs()


@pytest.mark.skipif(not BUILTIN, reason="no built-in configs under configs/ yet")
@pytest.mark.parametrize("config", BUILTIN, ids=[c.name for c in BUILTIN])
def test_builtin_config_is_valid(config):
    assert config.recipe, (
        f"{config.path}: the first comment block needs `# tunebench run RECIPE --config ...`"
    )
    problems, recipe = validate_file(config.path)
    assert recipe == config.recipe
    assert [str(p) for p in problems] == []
