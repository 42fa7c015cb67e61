"""Requests that would kill SGLang's scheduler are refused as bad input (host change
"reject-unservable-requests"); servable ones pass untouched."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor, DisallowedTokensLogitsProcessor

from sglang_specsot.host.changes import HOST_CHANGES
from sglang_specsot.serving.request_checks import (
    check_custom_logit_processor,
    check_input_not_empty,
    check_servable,
    validate_one_request_after,
)
from sglang_specsot.wiring import HOST_CHANGE_HOOKS


class KeepLogits(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list=None):
        return logits


def _request(processor=None, mm: bool = False, session: dict | None = None):
    return SimpleNamespace(custom_logit_processor=processor, contains_mm_input=lambda: mm, session_params=session)


@pytest.mark.parametrize("input_ids", [[], ()])
def test_an_input_of_no_tokens_is_refused(input_ids):
    with pytest.raises(ValueError, match=r"The input is empty \(0 tokens\).*non-empty `text`"):
        check_input_not_empty(_request(), input_ids)


@pytest.mark.parametrize(
    ("input_ids", "mm", "session"),
    [
        ([1], False, None),  # tokens
        (None, False, None),  # input_embeds
        ([], True, None),  # a multimodal processor's own tokens
        ([], False, {"id": "s1"}),  # a session's history
    ],
)
def test_inputs_with_tokens_or_another_source_pass(input_ids, mm, session):
    check_input_not_empty(_request(mm=mm, session=session), input_ids)


def test_a_session_without_an_id_does_not_supply_a_prompt():
    with pytest.raises(ValueError, match="empty"):
        check_input_not_empty(_request(session={"id": None}), [])


@pytest.mark.parametrize(
    "garbage",
    ["garbage", "{}", '{"callable": "zz"}', '{"callable": "00ff"}', 5, ["x"]],
)
def test_a_processor_that_does_not_deserialize_is_refused(garbage):
    with pytest.raises(ValueError) as err:
        check_custom_logit_processor(garbage)
    message = str(err.value)
    assert "is not a serialized CustomLogitProcessor" in message and ".to_str()" in message
    assert repr(garbage)[:20] in message


@pytest.mark.parametrize("processor", [KeepLogits, DisallowedTokensLogitsProcessor])
def test_serialized_processors_pass(processor):
    check_custom_logit_processor(processor.to_str())
    check_servable(_request(processor.to_str()), [1, 2])


def test_the_hook_checks_and_keeps_sglangs_result():
    assert validate_one_request_after(None, object(), _request(), [1]) is None
    with pytest.raises(ValueError, match="not a serialized"):
        validate_one_request_after(None, object(), _request("garbage"), [1])
    with pytest.raises(ValueError, match="empty"):
        validate_one_request_after(None, object(), _request(), [])
    check_servable(SimpleNamespace(contains_mm_input=lambda: False), [1])  # embedding: no processor


def test_the_hooked_method_takes_the_request_and_its_tokens():
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    change = next(c for c in HOST_CHANGES if c.name == "reject-unservable-requests")
    assert change.target.endswith("TokenizerManager._validate_one_request") and change.hook_type == "after"
    params = list(inspect.signature(TokenizerManager._validate_one_request).parameters)
    assert params == ["self", "obj", "input_ids"]
    assert change.hook is None and HOST_CHANGE_HOOKS[change.name]() is validate_one_request_after  # the plugin's


def test_server_side_sot_names_its_own_field_for_a_processor_that_cannot_run():
    from types import SimpleNamespace

    from sglang_specsot.serving.chat import _client_processor_error
    from sglang_specsot.sot.runner import SoTOptions

    enabled, disabled = SimpleNamespace(enable_custom_logit_processor=True), SimpleNamespace()
    bad = SoTOptions("on", skeleton_logit_processor="not a processor")
    assert _client_processor_error(bad, enabled).startswith('"specsot.skeleton_logit_processor": ')
    # Without the flag nothing is deserialized here: SGLang refuses any processor itself.
    assert _client_processor_error(bad, disabled) is None
    assert _client_processor_error(SoTOptions("on"), enabled) is None
