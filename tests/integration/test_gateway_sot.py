"""SoT through SGLang's model gateway (`smg`) in front of a real SmolLM2 server: server-side SoT
and the frontend program give the same greedy answers through the gateway as from the server
itself, with SoT's metadata; the chat field carried in `chat_template_kwargs` (for the older
router) answers the same."""

from __future__ import annotations

import pytest

from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.runner import SoTOptions
from tests.integration.gateway import gateway, http

pytestmark = pytest.mark.integration

SUITABLE = "How can I improve my time management skills?"
MAX_TOKENS = 96
CONFIG = {"skeleton_max_tokens": 96, "max_points": 3, "max_running": 2, "default_branch_tokens": 16,
          "min_branch_tokens": 8, "router_min_answer_tokens": 1}  # fmt: skip


@pytest.fixture(scope="module")
def server_and_gateway(smollm2_server, tmp_path_factory):
    """The session's plain SmolLM2 server, and the gateway in front of it."""
    with gateway([smollm2_server.base_url], tmp_path_factory.mktemp("gateway") / "smg.log") as url:
        yield smollm2_server.base_url, url


def _chat(base: str, model: str, **extra) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": SUITABLE}], "temperature": 0,
            "max_tokens": MAX_TOKENS, **extra}  # fmt: skip
    return http(f"{base}/v1/chat/completions", body, timeout=600)


def test_gateway_server_side_sot_answers_as_the_server_does(server_and_gateway):
    direct, through = server_and_gateway
    model = http(f"{direct}/v1/models")["data"][0]["id"]  # the gateway routes by the served name
    field = {"mode": "on", "config": CONFIG}
    want = _chat(direct, model, specsot=field)
    for got in (_chat(through, model, specsot=field), _chat(through, model, chat_template_kwargs={"specsot": field})):
        assert got["metadata"]["specsot"]["path"] == "sot", got.get("metadata")
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
        assert got["usage"] == want["usage"]


def test_gateway_frontend_program_answers_as_from_the_server(server_and_gateway, smollm2_path):
    from sglang_specsot.frontend import SoTEndpoint, answer_question, chat_renderer

    direct, through = server_and_gateway
    options = SoTOptions("on", SoTConfig(**CONFIG), MAX_TOKENS)
    render = chat_renderer(smollm2_path)
    want = answer_question(SoTEndpoint(direct), SUITABLE, render, options)
    got = answer_question(SoTEndpoint(through), SUITABLE, render, options)
    assert got.path == want.path == "sot"
    assert got.answer == want.answer and len(got.branches.results) == len(want.branches.results) >= 2
