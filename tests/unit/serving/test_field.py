"""The `specsot` request field and the server default: every mode of sot.tag, errors that say
what is wrong, with which value, and what is accepted."""

from __future__ import annotations

import json

import pytest

from sglang_specsot.serving.field import FIELD_KEYS, MODE_ENV, SoTField, default_mode, parse_field, server_limits
from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.limits import LIMITS_ENV, SoTLimits
from sglang_specsot.sot.runner import SoTOptions
from sglang_specsot.sot.tag import MODES


def _body(value: object) -> bytes:
    return json.dumps({"model": "default", "messages": [], "specsot": value}).encode()


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_of_the_tag_is_a_field_mode_and_a_server_default(mode, monkeypatch):
    assert parse_field(_body({"mode": mode}), "off").mode == mode
    monkeypatch.setenv(MODE_ENV, f" {mode.upper()} ")
    assert default_mode() == mode


def test_a_full_field_becomes_the_runner_options():
    value = {"mode": "on", "config": {"max_running": 3}, "skeleton_logit_processor": "{...}"}
    field = parse_field(_body(value), "off")
    assert field == SoTField("on", SoTConfig(max_running=3), "{...}")
    assert field.options(128) == SoTOptions("on", SoTConfig(max_running=3), 128, "{...}")


@pytest.mark.parametrize("body", [None, b"", b"[1, 2]", b'{"messages": []}', _body(None)])
def test_no_field_gives_the_server_default(body):
    assert parse_field(body, "auto") == SoTField("auto", SoTConfig())


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"mode": "always"}, '"specsot.mode" must be "auto", "on" or "off", got "always"'),
        ({"mode": "ON"}, 'got "ON"'),
        ("on", '"specsot" must be an object such as {"mode": "auto"}, got "on"'),
        ({"extra": 1, "mode": "on"}, f"unknown keys ['extra']; known keys are {list(FIELD_KEYS)}"),
        ({"config": [1]}, '"specsot.config" must be an object of SoTConfig fields, got [1]'),
        ({"config": {"nope": 1}}, "\"specsot.config\" has unknown fields ['nope']; SoTConfig has ["),
        ({"skeleton_logit_processor": 7}, "must be a serialized CustomLogitProcessor string"),
    ],
)
def test_a_malformed_field_says_what_and_which_value(value, says):
    with pytest.raises(ValueError) as info:
        parse_field(_body(value), "off")
    assert says in str(info.value)


def test_a_bad_server_default_names_the_variable_and_the_modes(monkeypatch):
    monkeypatch.setenv(MODE_ENV, "sometimes")
    with pytest.raises(ValueError, match=rf"{MODE_ENV}='sometimes' is not one of 'auto', 'on', 'off'"):
        default_mode()


def test_only_the_top_level_key_is_the_field_and_a_bare_config_means_auto():
    # The word inside a message is not the field.
    quoted = json.dumps({"messages": [{"role": "user", "content": 'what is "specsot"?'}]}).encode()
    assert parse_field(quoted, "off").mode == "off"
    field = parse_field(_body({"config": {"max_running": 2}}), "off")
    assert field.mode == "auto" and field.config.max_running == 2
    assert field.options(64) == SoTOptions("auto", SoTConfig(max_running=2), 64)


@pytest.mark.parametrize(
    "value",
    ["on", 1, [], {"mode": "ON"}, {"mode": None}, {"extra": 1}, {"config": "fast"},
     {"config": {"max_points": -1}}, {"config": {"nope": 1}}, {"skeleton_logit_processor": ""}],  # fmt: skip
)
def test_every_malformed_field_is_a_value_error(value):
    with pytest.raises(ValueError, match="specsot|max_points"):
        parse_field(_body(value), "off")


def test_the_server_default_is_off_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    assert default_mode() == "off"
    monkeypatch.setenv(MODE_ENV, "Auto")
    assert default_mode() == "auto"


def test_config_above_a_server_limit_is_refused_naming_the_limit_and_the_value():
    limits = SoTLimits(max_branches=8)
    with pytest.raises(ValueError, match=r'"specsot.config.max_points"=60 is above the server limit max_branches=8'):
        parse_field(_body({"config": {"max_points": 60}}), "off", limits)
    # Defaults above a lowered limit are clamped, with or without a field.
    assert parse_field(_body({"config": {"max_running": 2}}), "off", limits).config.max_points == 8
    assert parse_field(None, "auto", limits).config.max_points == 8


def test_a_body_that_is_not_json_is_a_value_error_that_says_so():
    for body in (b'{"specsot": \xff}', b'{"specsot": ', b'{"specsot": ' + b"[" * 100_000):
        with pytest.raises(ValueError, match="not a JSON object"):
            parse_field(body, "off")


def test_the_server_limits_come_from_the_environment_once(monkeypatch):
    server_limits.cache_clear()
    monkeypatch.setenv(LIMITS_ENV, '{"max_groups": 2}')
    try:
        assert server_limits() == SoTLimits(max_groups=2)
        monkeypatch.setenv(LIMITS_ENV, '{"max_groups": 3}')
        assert server_limits().max_groups == 2  # read once, at start-up
    finally:
        server_limits.cache_clear()


def _carried(value: object, top: object = None) -> bytes:
    body = {"model": "default", "messages": [], "chat_template_kwargs": {"specsot": value, "enable_thinking": False}}
    return json.dumps(body | ({"specsot": top} if top is not None else {})).encode()


def test_the_field_carried_in_chat_template_kwargs_reads_as_the_top_level_one():
    # sglang-router 0.3.2 drops an unknown top-level field; its typed request keeps this map.
    value = {"mode": "on", "config": {"max_running": 3}}
    assert parse_field(_carried(value), "off") == parse_field(_body(value), "off")
    assert parse_field(_carried(value, top=value), "off").mode == "on"  # the same in both places
    with pytest.raises(ValueError, match='"specsot" and "chat_template_kwargs.specsot" differ'):
        parse_field(_carried({"mode": "on"}, top={"mode": "off"}), "off")
    with pytest.raises(ValueError, match='"specsot.mode" must be'):
        parse_field(_carried({"mode": "always"}), "off")
