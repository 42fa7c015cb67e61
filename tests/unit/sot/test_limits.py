"""The server's SoT limits: defaults, the operator's JSON, and reject-versus-clamp per field."""

from __future__ import annotations

import pytest

from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.limits import BOUNDED_FIELDS, SoTLimits, answer_cap, bound_config, limits_from_json


def test_the_default_config_fits_the_default_limits():
    assert bound_config(SoTConfig(), SoTLimits()) == SoTConfig()


@pytest.mark.parametrize("name", sorted(BOUNDED_FIELDS))
def test_a_client_value_above_its_limit_is_refused_naming_both(name):
    limits = SoTLimits()
    limit_name = BOUNDED_FIELDS[name]
    value = getattr(limits, limit_name) + 1
    overrides = {name: value}
    if name in ("min_branch_tokens", "default_branch_tokens"):
        # SoTConfig's own order check (min <= default <= max) comes first.
        overrides.update(default_branch_tokens=value, max_branch_tokens=value)
    if name == "max_branches":
        overrides["max_points"] = value
    config = SoTConfig(**overrides)
    with pytest.raises(ValueError) as info:
        bound_config(config, limits, explicit={name})
    message = str(info.value)
    assert f'"specsot.config.{name}"={value}' in message and f"{limit_name}={value - 1}" in message
    assert "SGLANG_SPECSOT_LIMITS" in message


def test_a_default_above_a_lowered_limit_is_clamped():
    limits = SoTLimits(max_branches=4, max_running=2, max_branch_tokens=64, max_skeleton_tokens=100)
    config = bound_config(SoTConfig(), limits)
    assert (config.max_points, config.max_running, config.skeleton_max_tokens) == (4, 2, 100)
    assert (config.min_branch_tokens, config.default_branch_tokens, config.max_branch_tokens) == (32, 64, 64)


def test_the_issues_request_that_would_occupy_the_server_is_refused():
    config = SoTConfig(max_points=60, max_branches=60, max_running=60,
                       default_branch_tokens=10**6, max_branch_tokens=10**6)  # fmt: skip
    with pytest.raises(ValueError, match="above the server limit"):
        bound_config(config, SoTLimits(), explicit={"max_points", "max_branches", "max_running"})


def test_the_answer_cap_is_the_clients_within_the_limit():
    assert answer_cap(None, SoTLimits()) == 4096
    assert answer_cap(300, SoTLimits()) == 300 and answer_cap(10**9, SoTLimits()) == 4096


def test_limits_from_the_operators_json():
    assert limits_from_json(None) == SoTLimits() == limits_from_json("  ")
    assert limits_from_json('{"max_groups": 2}').max_groups == 2
    for text, says in [("{", "not JSON"), ("[1]", "JSON object"), ('{"max_gropus": 2}', "unknown keys"),
                       ('{"max_groups": 0}', "below 1"), ('{"max_branches": "8"}', "non-negative integer"),
                       ('{"max_running": true}', "non-negative integer")]:  # fmt: skip
        with pytest.raises(ValueError, match=says):
            limits_from_json(text)
