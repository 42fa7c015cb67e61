"""examples/normal_path_cost.py: what each path sends, how a reply is read, bad arguments refused."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "examples" / "normal_path_cost.py"
_spec = importlib.util.spec_from_file_location("normal_path_cost", _PATH)
npc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(npc)


def test_each_path_sends_the_same_greedy_question_its_own_way(monkeypatch):
    sent = []
    monkeypatch.setattr(npc, "post", lambda url, body, stream=False: sent.append((url, body, stream)))
    cells = npc.requests_for("http://h", "PROMPT", [{"role": "user", "content": "Q"}], 77)
    assert set(cells) == set(npc.PATHS)
    for name in npc.PATHS:
        cells[name]()
    by_path = dict(zip(npc.PATHS, sent))
    url, body, stream = by_path["generate"]
    assert url == "http://h/generate" and not stream and "stream" not in body
    assert body["sampling_params"] == {"temperature": 0, "max_new_tokens": 77}
    url, body, stream = by_path["generate-stream"]
    assert url == "http://h/generate" and stream and body["stream"] is True
    for name, mode in (("chat-off", "off"), ("chat-auto", "auto")):
        url, body, stream = by_path[name]
        assert url == "http://h/v1/chat/completions" and not stream
        assert body["specsot"] == {"mode": mode} and body["max_tokens"] == 77 and body["temperature"] == 0


def test_completion_tokens_read_from_either_reply_shape():
    assert npc.completion_tokens({"meta_info": {"completion_tokens": 12}}) == 12
    assert npc.completion_tokens({"usage": {"completion_tokens": 9}}) == 9
    assert npc.completion_tokens({"chunks": 3}) is None


class _Replies(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()
        if body.get("stream"):
            self.wfile.write(b'data: {"text": "a"}\n\ndata: {"text": "ab"}\n\ndata: [DONE]\n\n')
        else:
            self.wfile.write(json.dumps({"text": "ab", "meta_info": {"completion_tokens": 2}}).encode())

    def log_message(self, *args):
        pass


def test_a_stream_counts_its_data_chunks_and_a_reply_is_its_json():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Replies)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/generate"
        seconds, reply = npc.post(url, {"stream": True}, stream=True)
        assert reply == {"chunks": 2} and seconds >= 0
        _, reply = npc.post(url, {})
        assert npc.completion_tokens(reply) == 2
    finally:
        server.shutdown()


def test_an_unknown_path_is_refused_naming_the_choices(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["normal_path_cost.py", "--paths", "generate,chat-on", "--out", "x.jsonl"])
    with pytest.raises(SystemExit):
        npc.main()
    err = capsys.readouterr().err
    assert "chat-on" in err and "chat-auto" in err
