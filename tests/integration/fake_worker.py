"""A stand-in for an SGLang server behind a gateway: it answers the routes a gateway calls and
records every request it gets (path, headers, JSON body), readable at GET /_seen.

Run as a script: `python fake_worker.py PORT`. It answers SGLang's shapes closely enough for a
gateway to route to it (health, model info, chat, generate), and 200 with `{}` for anything else.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"
_seen: list[dict] = []
_lock = threading.Lock()


def _chat_response(body: dict) -> dict:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }  # fmt: skip


def _generate_response(body: dict) -> dict | list:
    one = {"text": "ok", "output_ids": [1], "meta_info": {"id": "fake", "prompt_tokens": 1, "completion_tokens": 1,
                                                        "cached_tokens": 0, "finish_reason": {"type": "stop"}}}  # fmt: skip
    text = body.get("text")
    return [one for _ in text] if isinstance(text, list) else one


GET_ROUTES = {
    "/health": {}, "/health_generate": {}, "/v1/models": {"object": "list", "data": [{"id": MODEL, "object": "model"}]},
    "/get_model_info": {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True},
    "/model_info": {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True},
    "/get_server_info": {"model_path": MODEL, "internal_states": [{}]},
    "/server_info": {"model_path": MODEL, "internal_states": [{}]},
}  # fmt: skip
POST_ROUTES = {"/v1/chat/completions": _chat_response, "/generate": _generate_response}


class Handler(BaseHTTPRequestHandler):
    def _reply(self, payload, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body) -> None:
        with _lock:
            _seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": body})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/_seen":
            with _lock:
                self._reply(list(_seen))
            return
        self._record(None)
        self._reply(GET_ROUTES.get(self.path.split("?")[0], {}))

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode(errors="replace")
        self._record(body)
        answer = POST_ROUTES.get(self.path.split("?")[0])
        self._reply(answer(body if isinstance(body, dict) else {}) if answer else {})

    def log_message(self, *args) -> None:  # quiet
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
