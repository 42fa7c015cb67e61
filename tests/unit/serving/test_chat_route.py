"""The host change "sot-chat-route": applied and verified in the HTTP server's process only,
refused twice, and a bad server default stops start-up before SGLang is changed."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from sglang_specsot.host import changes as host_changes
from sglang_specsot.host.changes import HOST_CHANGES, HostChange, apply_host_changes, register_host_change
from sglang_specsot.serving.field import MODE_ENV
from sglang_specsot.wiring import HOST_CHANGE_HOOKS

NAME = "sot-chat-route"
# With its hook as the plugin supplies it (the ledger entry names none: serving/ implements it).
CHANGE = dataclasses.replace(next(c for c in HOST_CHANGES if c.name == NAME), hook=HOST_CHANGE_HOOKS[NAME])


@pytest.fixture
def serving_chat(monkeypatch):
    """OpenAIServingChat with HookRegistry and the applied list restored after the test."""
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.plugins.hook_registry import HookRegistry

    own = vars(OpenAIServingChat).get("handle_request")
    hooks, patched = {k: list(v) for k, v in HookRegistry._hooks.items()}, set(HookRegistry._patched)
    monkeypatch.setattr(host_changes, "_applied", [])
    yield OpenAIServingChat
    if own is not None:
        OpenAIServingChat.handle_request = own
    elif "handle_request" in vars(OpenAIServingChat):
        delattr(OpenAIServingChat, "handle_request")  # it inherits OpenAIServingBase's
    HookRegistry._hooks.clear()
    HookRegistry._hooks.update(hooks)
    HookRegistry._patched.clear()
    HookRegistry._patched.update(patched)


def _only(monkeypatch, change: HostChange) -> None:
    monkeypatch.setattr(host_changes, "HOST_CHANGES", [change])


class _Serving:
    def create_error_response(self, message, err_type="BadRequestError", status_code=400):
        return (status_code, message)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    async def body(self) -> bytes:
        return self._body


def test_the_entry_names_its_target_seam_and_patch():
    assert CHANGE.target == "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat.handle_request"
    assert CHANGE.hook_type == "around" and CHANGE.patch == "chat-request-handlers.diff"
    assert CHANGE.when is host_changes.http_server_only


def test_only_the_http_server_process_takes_it():
    assert host_changes.http_server_only() is False  # pytest is no launcher
    ns = {"f": host_changes.http_server_only}
    for launcher in ("sglang/launch_server.py", "sglang/cli/serve.py"):
        exec(compile("result = f()", os.path.join("/site-packages", launcher), "exec"), ns)
        assert ns["result"] is True, launcher


def test_outside_the_http_server_the_chat_route_is_untouched(serving_chat, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = serving_chat.handle_request
    _only(monkeypatch, CHANGE)
    assert apply_host_changes() == []
    assert serving_chat.handle_request is before and CHANGE.target not in HookRegistry._hooks


def test_applied_and_verified_in_the_http_server(serving_chat, monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    original = serving_chat.handle_request
    _only(monkeypatch, dataclasses.replace(CHANGE, when=lambda: True))
    assert apply_host_changes() == [NAME]
    assert apply_host_changes() == [NAME]  # idempotent
    route = serving_chat.handle_request
    assert route.__wrapped__ is original
    # The hook answers a malformed field itself (400) instead of calling SGLang's handler.
    status, message = asyncio.run(route(_Serving(), object(), _Raw(b'{"specsot": 1}')))
    assert status == 400 and '"specsot" must be an object' in message


def test_a_hook_that_did_not_take_is_an_error(serving_chat, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(HookRegistry, "apply_hooks", classmethod(lambda cls: None))
    _only(monkeypatch, dataclasses.replace(CHANGE, when=lambda: True))
    with pytest.raises(RuntimeError, match=f"host change '{NAME}' was not applied to {CHANGE.target}"):
        apply_host_changes()


def test_a_bad_server_default_stops_start_up_before_anything_changes(serving_chat, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "sometimes")
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = serving_chat.handle_request
    earlier = HostChange("earlier", "sglang.srt.plugins.hook_registry.plugin_hook", "around",
                         lambda: (lambda original, *a, **k: original(*a, **k)), "why", "p.diff")  # fmt: skip
    monkeypatch.setattr(host_changes, "HOST_CHANGES", [earlier, dataclasses.replace(CHANGE, when=lambda: True)])
    with pytest.raises(SystemExit, match=f"sglang-specsot: {MODE_ENV}='sometimes'"):
        apply_host_changes()
    assert serving_chat.handle_request is before
    assert earlier.target not in HookRegistry._hooks and CHANGE.target not in HookRegistry._hooks


def test_a_quality_head_that_is_no_file_stops_start_up(serving_chat, monkeypatch):
    from sglang_specsot.sot.quality_gate import QUALITY_HEAD_ENV, configured_quality_gate

    monkeypatch.setenv(QUALITY_HEAD_ENV, "/nowhere/head.json")
    monkeypatch.setattr(host_changes, "HOST_CHANGES", [dataclasses.replace(CHANGE, when=lambda: True)])
    configured_quality_gate.cache_clear()
    try:
        with pytest.raises(SystemExit, match=f"sglang-specsot: {QUALITY_HEAD_ENV}='/nowhere/head.json' is no file"):
            apply_host_changes()
    finally:
        configured_quality_gate.cache_clear()


def test_the_chat_route_is_refused_twice():
    with pytest.raises(ValueError, match=f"duplicates '{NAME}'"):
        register_host_change(dataclasses.replace(CHANGE, name="another-chat-route"))
    with pytest.raises(ValueError, match="duplicates"):
        register_host_change(dataclasses.replace(CHANGE, target="sglang.x.y"))
    assert [c.name for c in HOST_CHANGES].count(NAME) == 1


def test_a_request_without_the_field_goes_to_sglang_as_it_came(monkeypatch):
    from sglang_specsot.serving.chat import around_handle_request

    monkeypatch.delenv(MODE_ENV, raising=False)
    calls = []

    async def original(*args):
        calls.append(args)
        return "sglang's response"

    serving, request = object(), object()
    raw = _Raw(b'{"model": "default", "messages": [{"role": "user", "content": "hi"}]}')
    assert asyncio.run(around_handle_request(original, serving, request, raw)) == "sglang's response"
    assert len(calls) == 1 and all(a is b for a, b in zip(calls[0], (serving, request, raw), strict=True))
