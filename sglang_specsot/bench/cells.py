"""Run one cell: flush the server's cache, ask one question one way, time the complete answer."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import threading
import time
import urllib.error
import uuid
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sglang_specsot.bench.configs import FRONTEND, NORMAL, SERVER_SOT, CellConfig
from sglang_specsot.bench.store import FAILED, OK, Branch, CellResult
from sglang_specsot.sot.loops import find_loop
from sglang_specsot.sot.prompts import expansion_prompt, normal_messages, skeleton_prompt
from sglang_specsot.sot.runner import shared_prefix

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Question:
    id: int
    text: str
    suitable: bool


@dataclass
class Target:
    """What a cell needs of a running server; `endpoint` (the frontend's) is made on first use."""

    url: str
    render: object  # chat messages -> prompt text, the model's own template
    alive: object = None  # () -> str | None: why the server is gone, None while it runs
    endpoint: object = None
    constrain_skeleton: bool = False  # what frontend cells pass: the server-side SoT rule


@dataclass(frozen=True, slots=True)
class Settings:
    max_tokens: int  # the answer's completion-token cap, normal or SoT (the SoT answer's total, sot/budget.py)
    timeout: float  # seconds per cell, enforced by the client
    sot_config: dict | None = None  # SoTConfig fields for both SoT routes; None: defaults
    # Prefill the prompts' fixed prefixes after each flush (`warm_prefixes`), untimed.
    warm_prefixes: bool = False
    # A system message sent before every question, normal or SoT, as many clients send one.
    system_prompt: str | None = None


def post_json(url: str, payload: dict | None, timeout: float) -> dict | str:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read().decode()
    try:
        return json.loads(body)
    except ValueError:
        return body


def run_cell(cfg: CellConfig, question: Question, target: Target, settings: Settings) -> CellResult:
    """Never raises and never waits past settings.timeout: a failure is a FAILED cell."""
    gone = target.alive() if target.alive else None
    if gone:
        return failed(cfg, question, gone)
    box: dict = {}

    def work() -> None:
        try:
            box["cell"] = _ask(cfg, question, target, settings)
        except Exception as exc:  # noqa: BLE001 - any request error becomes the cell's reason
            box["error"], box["timed_out"] = _describe(exc), _timed_out(exc)

    thread = threading.Thread(target=work, daemon=True)  # abandoned, not joined, on a timeout
    thread.start()
    thread.join(settings.timeout + 5)
    if thread.is_alive():
        abort_all(target.url)
        return failed(cfg, question, f"no answer within {settings.timeout:.0f}s")
    if "error" in box:
        if box["timed_out"]:  # the client gave up; the server did not
            abort_all(target.url)
        gone = target.alive() if target.alive else None
        return failed(cfg, question, gone or box["error"])
    return box["cell"]


def abort_all(url: str) -> None:
    """End every request on the server (SGLang's /abort_request with abort_all). A timed-out
    cell's request would otherwise keep decoding into the next cell: its flush refused while
    the scheduler is busy, its timing shared. Cells run one at a time, so all is that one."""
    try:
        post_json(url + "/abort_request", {"abort_all": True}, ABORT_TIMEOUT_S)
    except OSError as exc:  # a dead server is the next cell's failure to report
        logger.warning("abort after a timeout failed: %s", _describe(exc))


def failed(cfg: CellConfig, question: Question, reason: str) -> CellResult:
    logger.warning("cell %s / q%d failed: %s", cfg.name, question.id, reason)
    return CellResult(question.id, cfg.name, FAILED, question.suitable, reason=reason)


# SGLang refuses /flush_cache (400 "Flush cache failed.") while its scheduler is not fully
# idle, which it can still be for a moment after the last answer was returned.
FLUSH_WAIT_S, FLUSH_RETRY_S = 30.0, 0.5
ABORT_TIMEOUT_S = 5.0  # /abort_request after a cell's timeout; a live server answers at once


def flush_cache(url: str, timeout: float) -> None:
    """SGLang's /flush_cache: the KV cache and, on SPECSOT, the context drafter's corpus, so
    nothing drafts from an earlier answer to the same question."""
    deadline = time.monotonic() + min(FLUSH_WAIT_S, timeout)
    while True:
        try:
            post_json(url + "/flush_cache", None, timeout)
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 400 or time.monotonic() >= deadline:
                raise
        time.sleep(FLUSH_RETRY_S)


def _timed_out(exc: Exception) -> bool:
    return isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)


def _describe(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        detail = exc.read().decode(errors="replace")[:300]
        return f"HTTP {exc.code}: {detail}"
    return f"{type(exc).__name__}: {exc}"[:400]


def fixed_prefixes(render, system_prompt: str | None = None) -> list[str]:
    """The text every prompt of a kind starts with, whatever the question: the chat header of a
    normal answer, and SoT's skeleton prompt (system prompt and worked examples) and point
    prompt. Found as `shared_prefix` of two renders, cut at a line break so
    the radix cache matches them inside the real prompts."""
    probes = ("Why?", "How?")
    kinds = (lambda q: render(normal_messages(q, system_prompt)),
             lambda q: skeleton_prompt(q, instructions=system_prompt).render(render),
             lambda q: expansion_prompt(q, ["a", "b"], 0, instructions=system_prompt).render(render))  # fmt: skip
    return [prefix for kind in kinds if (prefix := shared_prefix(kind(q) for q in probes))]


def warm_prefixes(target: Target, timeout: float, system_prompt: str | None = None) -> None:
    """Prefill `fixed_prefixes` (no tokens generated), as a serving server holds them.

    Flushing before every cell keeps answers from drafting on earlier ones, but also drops
    prefixes a server in steady state never loses: SoT would then pay the prefill of its
    skeleton prompt's fixed part, the longest of them, in every answer. Every cell is warmed
    alike, normal or SoT; a run says in run.json whether it was.
    """
    for text in fixed_prefixes(target.render, system_prompt):
        post_json(target.url + "/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}}, timeout)


def _ask(cfg: CellConfig, question: Question, target: Target, settings: Settings) -> CellResult:
    flush_cache(target.url, settings.timeout)
    if settings.warm_prefixes:
        warm_prefixes(target, settings.timeout, settings.system_prompt)
    started = time.perf_counter()
    if cfg.kind == NORMAL:
        fields = _normal(target, question, settings, cfg.temperature, rid=f"{cfg.name}-q{question.id}-{uuid.uuid4().hex[:8]}")
    elif cfg.kind == SERVER_SOT:
        fields = _server_sot(target, question, cfg.mode, sot_config(cfg, settings), settings)
    elif cfg.kind == FRONTEND:
        fields = _frontend(target, question, cfg.mode, sot_config(cfg, settings), settings)
    else:
        raise AssertionError(f"unknown cell kind {cfg.kind!r}")
    latency = time.perf_counter() - started
    answer = fields.pop("answer")
    # Timings on a machine shared with other jobs: the load average says how shared it was.
    return CellResult(question.id, cfg.name, OK, question.suitable, latency=latency, answer=answer,
                      looped=find_loop(answer) is not None, load=os.getloadavg()[0], commit=code_commit(),
                      **fields)  # fmt: skip


@functools.lru_cache(maxsize=1)
def code_commit() -> str:
    """The git commit of the code that measured a cell ("" outside a checkout): a resumed run
    spans several invocations, and each cell must say which code measured it."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _normal(target: Target, question: Question, settings: Settings, temperature: float = 0.0, rid: str = "") -> dict:
    prompt = target.render(normal_messages(question.text, settings.system_prompt))
    out = post_json(target.url + "/generate", {"text": prompt, "rid": rid or None, "sampling_params": {
        "temperature": temperature, "max_new_tokens": settings.max_tokens}}, settings.timeout)  # fmt: skip
    meta = out["meta_info"]
    finish = meta.get("finish_reason") or {}
    return {"answer": out["text"], "output_tokens": meta["completion_tokens"],
            "finish_reason": finish.get("type", "") if isinstance(finish, dict) else str(finish),
            "accept_length": meta.get("spec_accept_length"), "rid": rid,
            "token_parts": {"prompt": meta.get("prompt_tokens"), "completion": meta["completion_tokens"]}}  # fmt: skip


def sot_config(cfg: CellConfig, settings: Settings) -> dict | None:
    """The SoTConfig fields a SoT cell sends: the run's --sot-config, then the cell's own."""
    merged = {**(settings.sot_config or {}), **dict(cfg.sot_config)}
    return merged or None


def _server_sot(target: Target, question: Question, mode: str, config: dict | None, settings: Settings) -> dict:
    specsot = {"mode": mode, **({"config": config} if config else {})}
    out = post_json(target.url + "/v1/chat/completions", {
        "model": "default", "messages": normal_messages(question.text, settings.system_prompt), "temperature": 0,
        "max_tokens": settings.max_tokens, "specsot": specsot}, settings.timeout)  # fmt: skip
    trace = (out.get("metadata") or {}).get("specsot") or {}
    choice = out["choices"][0]
    fields = {"answer": choice["message"].get("content") or "", **from_trace(trace)}
    # `usage` counts every token; a request the router sent down the normal path has no trace.
    fields["output_tokens"] = (out.get("usage") or {}).get("completion_tokens", fields["output_tokens"])
    if not trace:
        fields["finish_reason"] = choice.get("finish_reason") or ""
    return fields


def _frontend(target: Target, question: Question, mode: str, config: dict | None, settings: Settings) -> dict:
    from sglang_specsot.frontend import SoTEndpoint, answer_question
    from sglang_specsot.sot import SoTConfig
    from sglang_specsot.sot.runner import SoTOptions

    if target.endpoint is None:
        target.endpoint = SoTEndpoint(target.url)
    options = SoTOptions(mode=mode, config=SoTConfig(**(config or {})), max_new_tokens=settings.max_tokens,
                         system_prompt=settings.system_prompt)  # fmt: skip
    answer = answer_question(target.endpoint, question.text, render=target.render, options=options,
                             constrain_skeleton=target.constrain_skeleton)  # fmt: skip
    return {"answer": answer.answer, **from_trace(answer.trace())}


def from_trace(trace: dict) -> dict:
    """The cell's fields from a SoT trace (`metadata.specsot` or `SoTAnswer.trace()`)."""
    skeleton = trace.get("skeleton") or {}
    offset = skeleton.get("seconds", 0.0) + skeleton.get("parse_seconds", 0.0)
    items = (trace.get("branches") or {}).get("items") or []
    branches = tuple(Branch(b["index"], offset + b["started"], offset + b["finished"],
                            b.get("completion_tokens", 0), b.get("finish_reason", ""), b.get("ended", ""))
                     for b in items)  # fmt: skip
    normal = trace.get("normal") or {}
    merge = trace.get("merge")
    capped = any(b.finish_reason == "length" for b in branches) or normal.get("finish_reason") == "length"
    return {
        "output_tokens": (trace.get("usage") or {}).get("completion_tokens", 0),
        "accept_length": trace.get("spec_accept_length"),
        "path": trace.get("path", "normal"),
        "finish_reason": "length" if capped else "stop",
        "skeleton_seconds": skeleton.get("seconds"),
        "skeleton_text": skeleton.get("text", ""),
        "points": len(skeleton.get("points") or []),
        "fallback": bool(trace.get("fallback")),
        "skeleton_constrained": skeleton.get("constrained") if skeleton else None,
        "branches": branches,
        "empty_points": len(merge.get("empty_points") or ()) if merge is not None else None,
        "route_latency": (trace.get("route") or {}).get("latency"),
        "rid": f"specsot-{trace['group']}" if trace.get("group") else "",
        "token_parts": _sot_token_parts(skeleton, items) if skeleton and items else None,
    }


def _sot_token_parts(skeleton: dict, items: list[dict]) -> dict:
    """A SoT answer's prompt and generated tokens by part (CellResult.token_parts)."""
    ordered = sorted(items, key=lambda b: b["index"])
    return {"skeleton_prompt": skeleton.get("prompt_tokens"), "skeleton": skeleton.get("completion_tokens"),
            "branch_prompts": [b.get("prompt_tokens") for b in ordered],
            "branch_cached": [b.get("cached_tokens") for b in ordered]}  # fmt: skip
