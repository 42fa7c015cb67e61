"""SoT metadata carried in sampling_params.custom_params."""

from __future__ import annotations

import pytest

from sglang_specsot.speculative.meta import PLAIN, SoTMeta, parse_sot_meta


@pytest.mark.parametrize(
    ("params", "meta"),
    [
        (None, PLAIN),
        ({}, PLAIN),
        ({"other": 1}, PLAIN),
        ({"specsot": {"role": "plain"}}, PLAIN),
        ({"specsot": {"role": "skeleton", "group": "g1"}}, SoTMeta("skeleton", "g1")),
        ({"specsot": {"role": "branch", "group": "g1", "point": 2, "n": 5}}, SoTMeta("branch", "g1", 2, 5)),
    ],
)
def test_well_formed(params, meta):
    assert parse_sot_meta(params) == (meta, None)


@pytest.mark.parametrize(
    ("tag", "problem"),
    [
        ("branch", "must be an object"),
        ({"role": "leaf", "group": "g"}, "role must be one of"),
        ({"role": "branch", "point": 0, "n": 2}, "non-empty string group"),
        ({"role": "skeleton", "group": ""}, "non-empty string group"),
        ({"role": "branch", "group": "g" * 200, "point": 0, "n": 2}, "non-empty string group"),
        ({"role": "branch", "group": "g", "point": 3, "n": 2}, "0 <= point < n"),
        ({"role": "branch", "group": "g", "point": 0, "n": 0}, "1 <= n <="),
        ({"role": "branch", "group": "g", "point": "1", "n": 2}, "0 <= point < n"),
    ],
)
def test_malformed_falls_back_to_plain_with_a_reason(tag, problem):
    meta, reason = parse_sot_meta({"specsot": tag})
    assert meta == PLAIN
    assert problem in reason
