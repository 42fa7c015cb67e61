"""What the integration modules share: the CPU server arguments, a plain SmolLM2 server, and
SPECSOT servers whose teardown proves SGLang's strict idle memory check ran and passed."""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sglang_specsot.launch import ServerProcess
from sglang_specsot.serving.router_choice import ROUTER_ENV
from sglang_specsot.speculative.policy import config as policy_config
from tests.integration.parity import PARITY_QUESTIONS, plain_reference, plain_reference_on

# The SGLang model modules the suite's servers and engines serve (SmolLM2 and Llama heads, Qwen2).
SERVED_MODEL_MODULES = frozenset({"llama", "llama_eagle", "llama_eagle3", "qwen2", "qwen2_eagle"})


@pytest.fixture(scope="session", autouse=True)
def only_the_served_model_modules():
    """Every server and engine the integration tests start skips the SGLang model modules it
    never serves: SGLang imports every one of sglang/srt/models/ (about 285 architectures) to
    build its registry at each scheduler's start (models/registry.py, import_model_classes),
    seconds a start on two cores. SGLANG_DISABLED_MODEL_ARCHS is SGLang's own switch for this;
    the served modules load as before. A run that sets it keeps its own value."""
    import os

    import sglang.srt.models as models

    name = "SGLANG_DISABLED_MODEL_ARCHS"
    if name in os.environ:
        yield
        return
    modules = sorted(m.name for m in pkgutil.iter_modules(models.__path__) if not m.ispkg)
    os.environ[name] = ",".join(m for m in modules if m not in SERVED_MODEL_MODULES)
    try:
        yield
    finally:
        del os.environ[name]


# SGLang's context-only SPECSOT: no draft model, a 6-token verify window.
SPECSOT = ["--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", "6"]
# SGLang's strict idle memory check (scheduler.py:5290-5310, in on_idle) raises on a leaked KV
# slot or request row, which kills the scheduler, instead of logging a warning.
STRICT_MEM_CHECK_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
# SPECSOT drafts its whole window every step (not only where its costs say it pays): the
# parity tests that must see verify run on every step.
FIXED_WINDOW_ENV = {policy_config.FIXED_WINDOW_ENV: "1"}
LEAK_NEEDLES = ("memory leak detected", "double free", "use-after-free")
# Servers that never route an "auto" SoT request with the question classifier: without this, each
# one loads the classifier's sentence embedder in a background thread at start-up
# (serving/router_choice.warm_up), on the two cores its start-up timing probes measure. The
# classifier's server path runs on the session's plain server (test_sot_server.py, mode "auto").
RULES_ROUTER_ENV = {ROUTER_ENV: "rules"}
# Every server samples from the same seed each run: SGLang's --random-seed seeds its sampling, so a
# sampling test (the chi-squared of test_specsot_eagle3.py) draws the same tokens every run.
SERVER_SEED = 0


def scheduler_loop_line(overlap: bool) -> str:
    """The log line saying which of SGLang's scheduler loops drives the SPECSOT worker."""
    loop = "overlap (event_loop_overlap)" if overlap else "synchronous"
    return f"SPECSOT worker driven by the {loop} scheduler loop"
IDLE_CHECK_ROUNDS = 3  # fresh idle snapshots to see; the first may predate the idle loop
IDLE_CHECK_DEADLINE = 120.0  # a hang guard: an idle scheduler publishes one about every second


def cpu_args(max_total_tokens: int = 4096, mem_fraction_static: float | None = 0.3) -> list[str]:
    """SGLang's flags for a CPU server, small on purpose: two cores serve every configuration.

    --sleep-on-idle makes the idle scheduler poll once a second (idle_sleeper.py: poll(1000))
    instead of spinning, so on_idle, and its memory check, runs about once a second.
    --random-seed fixes what sampled requests draw, run after run.
    """
    args = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--dtype", "float32",
            "--max-total-tokens", str(max_total_tokens), "--sleep-on-idle", "--random-seed", str(SERVER_SEED)]  # fmt: skip
    if mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(mem_fraction_static)]
    return args


# What the plugin tells a CPU user to add, and says it chose when a speculative launch names no backend.
FIX = "--attention-backend specsot_cpu"


def without_backend(args: list[str]) -> list[str]:
    """`args` without their --attention-backend: a launch as a CPU user writes it."""
    i = args.index("--attention-backend")
    return args[:i] + args[i + 2 :]


# Plain greedy answers to the parity prompts, this many new tokens each, decoded once per
# session: the reference of every parity test of the model. Greedy in float32 at the same
# batch shapes, a shorter run's tokens are a prefix of these, so a test with a smaller cap
# compares with `ids[:cap]`, and one that needs fewer prompts takes the first whole batches,
# instead of decoding them again (minutes a run on a CPU).
# 28 questions and the 8 branch prompts are 36 prompts, every batch size 1..8 once (8 batches
# where 50 prompts took 13); 24 tokens each (from 50 x 32: 54% of the decode steps' tokens).
SMOLLM2_PARITY_TOKENS = 24
QWEN05_PARITY_TOKENS = 24
QWEN05_PARITY_QUESTIONS = PARITY_QUESTIONS
DRAFT_LAYERS = 12  # of 24: agrees with the target often, not always


@pytest.fixture(scope="session")
def qwen05_draft_path(qwen05_path, tmp_path_factory) -> str:
    """A draft model cut from Qwen2.5-Coder-0.5B: its first 12 layers."""
    out = tmp_path_factory.mktemp("draft") / f"qwen05-{DRAFT_LAYERS}l"
    subprocess.run(
        [sys.executable, "-m", "sglang_specsot.models", "truncate", qwen05_path,
         "--layers", str(DRAFT_LAYERS), "--out", str(out)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return str(out)


@pytest.fixture(scope="session")
def qwen05_parity(qwen05_path) -> tuple[list[str], list[list[int]]]:
    """The parity prompts in Qwen's chat format, and plain decoding's greedy ids for them."""
    args = cpu_args(max_total_tokens=8192, mem_fraction_static=0.5)
    return plain_reference(qwen05_path, args, QWEN05_PARITY_TOKENS, QWEN05_PARITY_QUESTIONS)


@pytest.fixture(scope="session")
def smollm2_parity(smollm2_path, smollm2_server) -> tuple[list[str], list[list[int]]]:
    """The 36 parity prompts in SmolLM2's chat format, and plain decoding's greedy ids for them,
    decoded on the session's plain server (its cache flushed first) rather than a server of their
    own: one SmolLM2 start less."""
    return plain_reference_on(smollm2_server, smollm2_path, SMOLLM2_PARITY_TOKENS)


# The plugin's trace (sglang_specsot_bootstrap.pth): each process that loads it appends a line.
PLUGIN_TRACE_ENV = "SGLANG_SPECSOT_TRACE_FILE"


@pytest.fixture(scope="session")
def smollm2_server(smollm2_path, tmp_path_factory) -> Iterator[ServerProcess]:
    """The session's plain SmolLM2 server, shared by the modules that need nothing but a plain
    server (a start is most of a small module's cost on two cores), set up for the disconnect
    tests at little cost: at debug level SGLang logs each request it aborts (scheduler.py:5722,
    5805), and a load snapshot published every decode step (not every 15th) keeps /v1/loads one
    step behind. `trace_path` is the plugin's trace of the processes it loaded in.

    A module that compares answers across servers flushes its KV cache first
    (`bench.cells.flush_cache`). Server-side SoT's length book learns only from normal answers
    its latency model chose in mode "auto" (serving/chat.py); of the modules sharing this server
    only test_sot_server.py asks for those, so what it learns stays within that module."""
    trace = tmp_path_factory.mktemp("plugin-trace") / "plugin.jsonl"
    args = cpu_args() + ["--log-level", "debug", "--load-snapshot-publish-interval", "1"]
    with ServerProcess(smollm2_path, args, env={PLUGIN_TRACE_ENV: str(trace)}) as server:
        server.trace_path = trace
        yield server


def stream_data(server: ServerProcess, payload: dict, timeout: float = 600) -> Iterator[str]:
    """The `data:` payloads of a streamed /v1/chat/completions answer to `payload`, as they
    arrive ("[DONE]" included), so a test can act after the first chunk."""
    req = urllib.request.Request(
        server.base_url + "/v1/chat/completions",
        data=json.dumps({**payload, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: "):
                yield line[len("data: ") :]


def stream_events(server: ServerProcess, payload: dict) -> list[dict]:
    """The JSON events of a streamed /v1/chat/completions answer to `payload`, [DONE] left out."""
    return [json.loads(data) for data in stream_data(server, payload) if data != "[DONE]"]


@contextmanager
def leak_checked_server(
    model_path: str, args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """A server under SGLang's strict idle memory check; once the caller is done with it, this
    proves the check ran after the last request and found nothing, or fails."""
    env = {**STRICT_MEM_CHECK_ENV, **RULES_ROUTER_ENV, **(env or {})}
    with ServerProcess(model_path, args, env=env, log_path=log_path) as server:
        yield server
        assert_idle_memory_check_passed(server)


def assert_idle_memory_check_passed(server: ServerProcess) -> None:
    """Wait for IDLE_CHECK_ROUNDS load snapshots the idle scheduler published after now.

    SGLang publishes the fully-idle snapshot in on_idle only after the memory check
    (scheduler.py:5322, `snapshot = self.publish_load_snapshot(force=True)`, after
    `_check_all_pools` and `_check_req_pool` at 5292-5297, skipped only with hisparse or
    disaggregated decoding, neither used here); a leak raises there under the strict check and
    the scheduler dies before publishing. Busy paths publish too, but only while requests run
    (scheduler.py:5082) or for one loop turn after the last batch (5260): of several fresh
    snapshots with nothing running or waiting, all but the first come from the idle path.
    """
    since, seen = time.time(), set()
    deadline = time.monotonic() + IDLE_CHECK_DEADLINE
    while len(seen) < IDLE_CHECK_ROUNDS:
        assert time.monotonic() < deadline, (
            f"SGLang's idle memory check did not run {IDLE_CHECK_ROUNDS} times in "
            f"{IDLE_CHECK_DEADLINE:.0f}s (fresh idle load snapshots: {len(seen)}):\n{_log_tail(server)}"
        )
        load = _load_snapshot(server)
        if load["timestamp"] > since and load["num_running_reqs"] == load["num_waiting_reqs"] == 0:
            seen.add(load["timestamp"])
        time.sleep(0.25)
    log = server.log_path.read_text()
    found = [needle for needle in LEAK_NEEDLES if needle in log]
    assert not found, f"SGLang's memory check reported {found}:\n{_log_tail(server)}"


def _load_snapshot(server: ServerProcess) -> dict:
    """The scheduler's last published load; a dead server (under the strict check a leak kills
    the scheduler, and SGLang then the whole server) fails with its log."""
    try:
        return server.get("/v1/loads")["loads"][0]
    except OSError as exc:  # refused or reset: URLError and ConnectionResetError are OSErrors
        raise AssertionError(f"the server died while idle ({exc!r}):\n{_log_tail(server)}") from exc


def _log_tail(server: ServerProcess, lines: int = 40) -> str:
    """The server log's last lines, without the access lines of this module's own polling."""
    kept = [line for line in server.log_tail(2000).splitlines() if "GET /v1/loads" not in line]
    return "\n".join(kept[-lines:])


# -- watching SoT generations in a server's log (fault tests) ----------------------------------

# Flags that make a server's log say which generation started and which SGLang aborted: at debug
# level the scheduler logs each unfinished request an AbortReq reaches (scheduler.py:5722 queued,
# 5805 running); --log-requests at level 0 logs every GenerateReqInput's rid and no text
# (request_logger.py:116); a load snapshot every decode step keeps /v1/loads one step behind.
WATCHED_ARGS = ["--log-level", "debug", "--load-snapshot-publish-interval", "1",
                "--log-requests", "--log-requests-level", "0"]  # fmt: skip
# One SPECSOT server (SmolLM2-135M) with custom logit processors on and its log watched, shared by
# the bad-input, bad-request and fault modules: each starts from whatever the others left, which
# is the point of those tests (a server that keeps serving), and a server start is most of a
# small module's cost on two cores. The frontend and skeleton-constraint modules compare its
# greedy answers with a plain server's, after flushing its cache. SGLang's priority scheduling is
# on for the priority module; a request without a priority is queued first come, first served, as
# without the flag. Its teardown, after the session's last request to it, proves SGLang's strict
# idle memory check ran and found nothing.
SHARED_SPECSOT_ARGS = (cpu_args() + SPECSOT + ["--enable-custom-logit-processor", "--enable-priority-scheduling"]
                       + WATCHED_ARGS)  # fmt: skip


@pytest.fixture(scope="session")
def shared_specsot_server(smollm2_path, tmp_path_factory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("shared-specsot") / "server.log"
    with leak_checked_server(smollm2_path, SHARED_SPECSOT_ARGS, log) as server:
        yield server


# Server-side SoT names its generations "specsot-<group>-<role>-<n>", a branch's role with its
# point: "branch3" (serving/backend.py).
SOT_RID = r"specsot-(?P<group>[0-9a-f]+)-(?P<role>[a-z]+)(?P<point>\d*)-(?P<n>\d+)"
RECEIVED_RID = re.compile(r"Receive: obj=GenerateReqInput\(.*?rid='(" + SOT_RID + ")'")
ABORTED_RID = re.compile(r"Abort (?:running|queued) request\. req\.rid='(" + SOT_RID + ")'")
HANG_GUARD = 120.0  # seconds; waiting on a server is bounded, never a speed assertion


def load_snapshot(server: ServerProcess) -> dict:
    """The scheduler's last published load (a dead server fails with its log)."""
    return _load_snapshot(server)


def is_idle(server: ServerProcess) -> bool:
    load = load_snapshot(server)
    return load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0


def wait_for(predicate, what: str, poll: float = 0.2, deadline: float = HANG_GUARD) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        assert time.monotonic() < end, f"timed out after {deadline:.0f}s waiting for {what}"
        time.sleep(poll)


def log_size(server: ServerProcess) -> int:
    return server.log_path.stat().st_size


def log_since(server: ServerProcess, start: int) -> str:
    with open(server.log_path, "rb") as log:
        log.seek(start)
        return log.read().decode(errors="replace")


def sot_rids(pattern: re.Pattern, text: str, role: str | None = None) -> dict[str, set[str]]:
    """The SoT rids a log text names through `pattern` (RECEIVED_RID or ABORTED_RID), by group."""
    groups: dict[str, set[str]] = {}
    for match in pattern.finditer(text):
        if role is None or match["role"] == role:
            groups.setdefault(match["group"], set()).add(match[1])
    return groups


@contextmanager
def paused(server: ServerProcess) -> Iterator[int]:
    """SGLang paused in place (running requests stay, nothing decodes), so until it resumes a
    generation can end only by an abort; yields the log offset at the pause."""
    server.post("/pause_generation", {"mode": "in_place"})
    try:
        yield log_size(server)
    finally:
        server.post("/continue_generation", {"torch_empty_cache": False})


def abort_request(server: ServerProcess, rid: str = "", abort_all: bool = False) -> None:
    """SGLang's /abort_request (an empty 200; TokenizerManager ignores a rid it does not know)."""
    body = json.dumps({"rid": rid, "abort_all": abort_all}).encode()
    req = urllib.request.Request(server.base_url + "/abort_request", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as response:
        assert response.status == 200, response.status


def assert_every_step_replayed_a_tier(server: ServerProcess, static_shape: bool, widths: int = 1) -> dict:
    """Through the static-shape twin, every decode step's verify ran at a captured tier and
    replayed (none eager), at `widths` different tiers at least; eagerly, none replayed.
    Returns /server_info's `verify_graphs`."""
    graphs = server.get("/server_info")["internal_states"][0]["specsot"]["verify_graphs"]
    replayed, eager = graphs["replayed_by_width"], graphs["eager_by_width"]
    if not static_shape:
        assert graphs["graphs"] is False and not replayed and eager, graphs
        return graphs
    assert graphs["graphs"] == "static_shape_twin" and not eager, graphs
    assert {int(w) for w in replayed} <= set(graphs["tiers"]) and len(replayed) >= widths, graphs
    return graphs
