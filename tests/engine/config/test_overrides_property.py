"""Property: any override string either parses/applies or raises ConfigError — nothing else."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import ConfigError, apply_overrides, parse_overrides

CFG = {
    "lr": 1e-3,
    "model": {"dim": 64, "layers": [1, 2]},
    "optimizer": {"_component_": "torch.optim.SGD", "lr": 0.1},
    "data": [{"source": "a"}],
}
ALPHABET = st.sampled_from(
    list("abz019._~+=-[]{}:,'\"!&*#|>%@`$ \t\\\n") + ["lr", "model", "optimizer", "data", "dim"]
)
override_text = st.one_of(st.text(max_size=40), st.lists(ALPHABET, max_size=15).map("".join))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(override_text, max_size=3))
def test_random_overrides_raise_only_config_error(texts):
    try:
        ovs = parse_overrides(texts)
        apply_overrides(CFG, ovs)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        assert str(exc)


REF_PIECES = st.sampled_from(
    ["${", "}", "$${", "a", "b", ".", "0", "1", "x", "$", "lr", "model.dim", "data.0.source"]
)
ref_text = st.lists(REF_PIECES, max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "x"]), st.one_of(ref_text, st.lists(ref_text, max_size=2)), max_size=3
    )
)
def test_random_interpolations_raise_only_config_error(extra):
    from engine.config import resolve_interpolations

    cfg = dict(CFG, **extra)
    try:
        resolve_interpolations(cfg)
    except ConfigError as exc:
        assert "\n" not in str(exc)
