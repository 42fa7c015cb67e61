"""Requests that would kill the scheduler, against a real SPECSOT server (SmolLM2-135M) that
runs custom logit processors: each gets HTTP 400 with a message, and the next request is served.

Without host change "reject-unservable-requests", each one kills the scheduler, and with it the
whole server: a `custom_logit_processor` that does not deserialize (custom_logit_processor.py:20),
a text of 0 tokens (rotary_embedding/base.py:347 on CPU), and server-side SoT's
`specsot.skeleton_logit_processor` (sent to the scheduler as the skeleton's processor). A JSON
array as a chat request's body, a 500 in SGLang, is a 400 too (host change "chat-body-is-an-object").
The server, shared with the bad-input and fault modules, is under SGLang's strict idle memory
check, which must pass after the session's last request to it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.budget import min_sot_tokens

pytestmark = pytest.mark.integration

GOOD = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
NOT_A_PROCESSOR = "garbage"
CHAT = {
    "model": "default",
    "messages": [{"role": "user", "content": "Give three tips for staying healthy."}],
    "max_tokens": 24,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def server(shared_specsot_server):
    # The session's SPECSOT server with custom logit processors (conftest.py); its teardown, after
    # the session's last request, proves SGLang's idle memory check ran and passed.
    return shared_specsot_server


def _post(server, path: str, payload: dict | list) -> tuple[int, str]:
    req = urllib.request.Request(
        server.base_url + path, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _assert_still_serving(server) -> None:
    status, body = _post(server, "/generate", GOOD)
    assert status == 200, f"the request after a bad one failed ({status}): {body}\n{server.log_tail()}"
    assert json.loads(body)["meta_info"]["completion_tokens"] > 0


BAD_GENERATE = {
    "garbage processor": (
        {**GOOD, "custom_logit_processor": NOT_A_PROCESSOR},
        "is not a serialized CustomLogitProcessor",
    ),
    "processor of bad hex": (
        {**GOOD, "custom_logit_processor": json.dumps({"callable": "00zz"})},
        "is not a serialized CustomLogitProcessor",
    ),
    "empty text": ({**GOOD, "text": ""}, "The input is empty (0 tokens)"),
    # SGLang refuses this one itself (io_struct.py:499); here to keep it so.
    "empty input_ids": ({"input_ids": [], "sampling_params": GOOD["sampling_params"]}, "input_ids cannot be empty"),
    "one empty text in a batch": ({**GOOD, "text": ["Hello", ""]}, "The input is empty (0 tokens)"),
}


@pytest.mark.parametrize("name", list(BAD_GENERATE))
def test_generate_refuses_with_400_and_keeps_serving(server, name):
    payload, message = BAD_GENERATE[name]
    status, body = _post(server, "/generate", payload)
    assert status == 400, f"{name}: {status} {body}"
    assert message in json.loads(body)["error"]["message"], body
    _assert_still_serving(server)


def test_streamed_generate_reports_the_error_and_keeps_serving(server):
    # SGLang's streaming route has already sent 200 when generate_request raises; it reports
    # the ValueError as an error event (http_server.py:957-975).
    status, body = _post(server, "/generate", {**GOOD, "stream": True, "custom_logit_processor": NOT_A_PROCESSOR})
    assert status == 200 and "is not a serialized CustomLogitProcessor" in body and '"code":400' in body, body
    _assert_still_serving(server)


def test_openai_completions_refuse_an_empty_prompt(server):
    # SGLang's OpenAI route refuses this one itself (serving_completions.py:67); here to keep it so.
    status, body = _post(server, "/v1/completions", {"model": "default", "prompt": "", "max_tokens": 8})
    assert status == 400 and "Prompt cannot be empty" in body, body
    _assert_still_serving(server)


def test_chat_refuses_a_json_array_as_its_body(server):
    # A new user's slip: the messages list sent as the whole body. SGLang's body model raises
    # AttributeError on it (protocol.py:1157), a 500; serving/chat_body.py makes it a 400.
    status, body = _post(server, "/v1/chat/completions", CHAT["messages"])
    assert status == 400 and "must be a JSON object" in body, body
    _assert_still_serving(server)


def test_sot_refuses_a_skeleton_processor_that_does_not_deserialize(server):
    # The smallest cap an SoT answer fits in: below it the answer goes normal, with no skeleton
    # whose processor would be checked.
    sot_chat = {**CHAT, "max_tokens": min_sot_tokens(SoTConfig())}
    payload = {**sot_chat, "specsot": {"mode": "on", "skeleton_logit_processor": NOT_A_PROCESSOR}}
    status, body = _post(server, "/v1/chat/completions", payload)
    assert status == 400, f"{status} {body}"
    assert "is not a serialized CustomLogitProcessor" in body, body
    _assert_still_serving(server)
    status, body = _post(server, "/v1/chat/completions", {**sot_chat, "specsot": {"mode": "on"}})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"], body
