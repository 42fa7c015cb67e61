"""A chat request whose JSON body is not an object is a 400, not SGLang's 500.

FastAPI validates the chat route's body as `ChatCompletionRequest`, whose "before" model
validators (`set_tool_choice_default`, `normalize_reasoning_inputs`, `set_json_schema`;
sglang/srt/entrypoints/openai/protocol.py:1075-1160) call `values.get(...)` before pydantic has
checked that the body is an object. A JSON array (or string, number, null) raises AttributeError
there, which FastAPI does not turn into a validation error: the client gets a 500. Host change
"chat-body-is-an-object" checks the parsed body where SGLang parses it (`ORJSONRequest.json`)
and answers an HTTPException(400), which FastAPI re-raises and SGLang's handler sends as its
usual error body. Other routes' models refuse a non-object body themselves (a 400).
"""

from __future__ import annotations

CHAT_ROUTE = "/v1/chat/completions"
_JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number", type(None): "null"}


def check_chat_body(path: str, body: object) -> None:
    """ValueError when `body`, parsed from a request to `path`, is a chat request that is no
    JSON object; any other route or body passes."""
    if not path.endswith(CHAT_ROUTE) or isinstance(body, dict):
        return
    kind = _JSON_TYPES.get(type(body), type(body).__name__)
    hint = " To ask several chats, send one request for each." if isinstance(body, list) else ""
    raise ValueError(
        f"The body of POST {CHAT_ROUTE} must be a JSON object (one chat completion request), but it is {kind}. "
        'Send an object such as {"model": "default", "messages": [{"role": "user", "content": "Hello"}]}.' + hint
    )


async def chat_body_around(original, request):
    """AROUND hook on SGLang's ORJSONRequest.json(): the parsed body, checked on the chat route."""
    from fastapi import HTTPException

    body = await original(request)
    try:
        check_chat_body(request.url.path, body)
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    return body
