"""Host change "chat-body-is-an-object": a chat request whose JSON body is an array (or any
non-object) is a 400 with a message, where SGLang's own body model answers 500."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from sglang_specsot.host.changes import HOST_CHANGES, http_server_only
from sglang_specsot.serving.chat_body import CHAT_ROUTE, chat_body_around, check_chat_body
from sglang_specsot.wiring import HOST_CHANGE_HOOKS

NAME = "chat-body-is-an-object"
CHANGE = dataclasses.replace(next(c for c in HOST_CHANGES if c.name == NAME), hook=HOST_CHANGE_HOOKS[NAME])
ARRAY = [{"role": "user", "content": "Hello"}]  # the messages list sent as the whole body


@pytest.mark.parametrize(("body", "kind"), [(ARRAY, "an array"), ("hi", "a string"), (3, "a number"), (None, "null")])
def test_a_chat_body_that_is_no_object_is_refused_with_the_fix(body, kind):
    with pytest.raises(ValueError, match=f"must be a JSON object .* but it is {kind}") as info:
        check_chat_body(CHAT_ROUTE, body)
    assert '"messages": [{"role": "user"' in str(info.value)
    assert ("one request for each" in str(info.value)) is isinstance(body, list)


def test_objects_and_other_routes_pass():
    check_chat_body(CHAT_ROUTE, {"messages": ARRAY})
    check_chat_body("/root" + CHAT_ROUTE, {"messages": ARRAY})
    check_chat_body("/v1/completions", ARRAY)  # its model refuses a non-object itself
    check_chat_body("/generate", ARRAY)


class _Request:
    def __init__(self, path: str) -> None:
        self.url = type("URL", (), {"path": path})()


def _around(body, path: str = CHAT_ROUTE):
    async def original(request):
        return body

    return asyncio.run(chat_body_around(original, _Request(path)))


def test_the_hook_answers_an_http_400_and_passes_objects_as_parsed():
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as info:
        _around(ARRAY)
    assert info.value.status_code == 400 and "JSON object" in info.value.detail
    assert _around({"messages": ARRAY}) == {"messages": ARRAY}
    assert _around(ARRAY, "/generate") == ARRAY


def test_the_entry_targets_where_sglang_parses_json_in_the_http_server_only():
    assert CHANGE.target == "sglang.srt.entrypoints.http_server.ORJSONRequest.json"
    assert CHANGE.hook_type == "around" and CHANGE.when is http_server_only
    assert CHANGE.hook() is chat_body_around


def test_the_chat_model_fails_on_an_array_as_the_hook_says_and_a_fastapi_route_answers_400_with_it():
    """SGLang's ChatCompletionRequest raises AttributeError on an array (FastAPI's 500); through a
    JSON parse wrapped by the hook, the same route answers 400 and then serves a good request."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse
    from fastapi.routing import APIRoute
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    with pytest.raises(AttributeError):
        ChatCompletionRequest.model_validate(ARRAY)

    class CheckedRequest(Request):
        async def json(self):
            return await chat_body_around(lambda request: Request.json(request), self)

    class CheckedRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def checked(request):  # as SGLang's ORJSONRoute hands its ORJSONRequest on
                return await handler(CheckedRequest(request.scope, request.receive))

            return checked

    def build(route_class) -> TestClient:
        app = FastAPI()
        app.router.route_class = route_class

        @app.exception_handler(HTTPException)
        async def as_sglang(request, exc):  # SGLang's ErrorResponse shape (http_server.py:578)
            return JSONResponse({"object": "error", "message": exc.detail, "code": exc.status_code}, exc.status_code)

        async def chat(request):
            return {"messages": len(request.messages)}

        chat.__annotations__["request"] = ChatCompletionRequest  # a class, not this module's string
        app.post(CHAT_ROUTE)(chat)
        return TestClient(app, raise_server_exceptions=False)

    assert build(APIRoute).post(CHAT_ROUTE, json=ARRAY).status_code == 500  # what SGLang does today
    client = build(CheckedRoute)
    refused = client.post(CHAT_ROUTE, json=ARRAY)
    assert refused.status_code == 400 and "must be a JSON object" in refused.json()["message"]
    assert client.post(CHAT_ROUTE, json={"model": "m", "messages": ARRAY}).json() == {"messages": 1}
