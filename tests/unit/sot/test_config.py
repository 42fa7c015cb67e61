"""SoTConfig validation: bad values raise ValueError naming the value and the fix."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_specsot.sot import SoTConfig


def test_defaults_are_valid_and_frozen():
    config = SoTConfig()
    assert config.branch_cap == config.max_points
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_points = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_points": 1}, r"max_points=1 is below min_points=2.*max_points >= 2"),
        ({"min_points": 1}, r"min_points=1 is below 2.*min_points >= 2"),
        ({"min_points": 0}, r"min_points=0 must be a positive integer"),
        ({"max_points": 2.5}, r"max_points=2.5 must be a positive integer"),
        ({"max_running": True}, r"max_running=True must be a positive integer"),
        ({"max_branches": 11}, r"max_branches=11 must lie in \[min_points, max_points\] = \[2, 10"),
        ({"max_branches": 1}, r"max_branches=1 must lie in"),
        ({"max_point_words": 0}, r"max_point_words=0 must be a positive integer"),
        ({"long_point_policy": "drop"}, r"long_point_policy='drop' is not one of.*'truncate'"),
        ({"min_branch_tokens": 300}, r"min_branch_tokens <= default_branch_tokens.*300 <= 128"),
        ({"default_branch_tokens": 500}, r"128 <= 500 <= 384|32 <= 500 <= 384"),
        ({"predicted_length_slack": 0.5}, r"predicted_length_slack=0.5 is outside \[1.0, 4.0\]"),
        ({"predicted_length_slack": "1.2"}, r"predicted_length_slack='1.2' must be a number"),
        ({"retry_empty_points": "yes"}, r"retry_empty_points='yes' must be True or False"),
        ({"router_min_answer_tokens": -5}, r"router_min_answer_tokens=-5 must be a positive"),
    ],
)
def test_invalid_values_raise_with_value_and_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SoTConfig(**kwargs)


def test_consistent_custom_config():
    config = SoTConfig(min_points=3, max_points=6, max_branches=4, max_running=8)
    assert config.branch_cap == 4
    # More running slots than branches is fine: the scheduler never starts more than exist.
    assert config.max_running == 8
