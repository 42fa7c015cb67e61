"""Property-based fuzzing of the `specsot` request field: whatever the body, parse_field gives
a field within the server's limits or a ValueError with a message; nothing else escapes."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_specsot.serving.field import SoTField, parse_field
from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.limits import BOUNDED_FIELDS, SoTLimits

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = SoTLimits(max_branches=8, max_running=4, max_branch_tokens=256, max_skeleton_tokens=128)

_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(), st.text(max_size=20))
_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=25,
)
_CONFIG_KEYS = st.sampled_from(sorted(SoTConfig.__dataclass_fields__) + ["max_pionts", ""])
_CONFIG = st.dictionaries(_CONFIG_KEYS, st.one_of(st.integers(-5, 5000), _SCALAR), max_size=6)
_FIELD = st.one_of(
    _JSON,
    st.fixed_dictionaries({}, optional={
        "mode": st.one_of(st.sampled_from(["auto", "on", "off", "ON", ""]), _JSON),
        "config": st.one_of(_CONFIG, _JSON),
        "skeleton_logit_processor": st.one_of(st.text(max_size=20), _JSON),
        "extra": _JSON,
    }),
)  # fmt: skip


def _parse(body: bytes) -> SoTField | None:
    try:
        field = parse_field(body, "off", LIMITS)
    except ValueError as exc:
        assert str(exc), "a rejection says why"
        assert len(str(exc)) < 2_000, "a rejection quotes the client's value, cut short"
        return None
    assert isinstance(field, SoTField) and isinstance(field.config, SoTConfig)
    for name, limit_name in BOUNDED_FIELDS.items():
        value = getattr(field.config, name)
        assert value is None or value <= getattr(LIMITS, limit_name), name
    return field


@FUZZ
@given(value=_FIELD)
def test_any_json_field_parses_within_limits_or_is_a_value_error(value):
    _parse(json.dumps({"model": "m", "messages": [], "specsot": value}).encode())


@FUZZ
@given(body=st.binary(max_size=200))
def test_any_bytes_are_a_field_or_a_value_error(body):
    _parse(body)
    _parse(b'{"specsot": ' + body)  # bytes after the key, so the JSON parser sees them


@FUZZ
@given(text=st.text(max_size=200))
def test_any_text_is_a_field_or_a_value_error(text):
    _parse(text.encode("utf-8", "surrogatepass"))
    _parse(f'{{"specsot": {text}'.encode("utf-8", "surrogatepass"))


def test_deep_nesting_is_a_value_error_not_a_recursion_error():
    deep = b'{"specsot": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert _parse(deep) is None
    deep_object = b'{"specsot": {"config": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001 + b"}"
    assert _parse(deep_object) is None
