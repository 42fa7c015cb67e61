"""The replay stage's engines (scripts/gpu_stage_replay.py): each sglang.Engine in a process of
its own, so several live at once on one GPU with their own environments (SGLang reads
SGLANG_SIMULATE_ACC_LEN and SPECSOT reads SGLANG_SPECSOT_REPLAY when their scheduler starts)
and none shares another's process-wide state.

The stage sends an engine one answer at a time; the engine's process times it (the answer's
generate calls, nothing of the pipe) and sends back the seconds and each request's meta_info.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass

import gpu_replay_answers as answers
from gpu_replay_answers import AnswerShape, Limits, Request

STOP_S = 60  # what an engine may take to shut down before its process is killed


@dataclass(frozen=True)
class AnswerRun:
    """One answer to time: the normal answer (`sot` False) or the SoT answer, in pass `tag`."""

    answer: AnswerShape
    tag: str
    sot: bool
    limits: Limits


@dataclass(frozen=True)
class Timed:
    """What one answer took: its end-to-end seconds and each request's meta_info, in order."""

    seconds: float
    metas: tuple[dict, ...]

    @property
    def accept_lengths(self) -> list[float]:
        return [
            m["spec_accept_length"]
            for m in self.metas
            if m.get("spec_accept_length") is not None
        ]


def _generate(engine, requests: list[Request]) -> list[dict]:
    """One generate call for `requests` together (a batch: SGLang schedules them at once)."""
    return engine.generate(input_ids=[list(r.input_ids) for r in requests],
                           sampling_params=[r.params() for r in requests], rid=[r.rid for r in requests])  # fmt: skip


def time_answer(engine, run: AnswerRun) -> Timed:
    """The answer's generate calls, timed end to end: the normal answer alone, or the skeleton
    then all branches at once."""
    started = time.perf_counter()
    if run.sot:
        outs = _sot_answer(engine, run)
    else:
        outs = _generate(
            engine, [answers.normal_request(run.answer, run.tag, run.limits)]
        )
    seconds = time.perf_counter() - started
    return Timed(seconds, tuple(_meta(o) for o in outs))


def _sot_answer(engine, run: AnswerRun) -> list[dict]:
    """The skeleton, then its branches at once: their prompts start with the skeleton's prompt
    and output, which the radix cache holds."""
    skeleton = answers.skeleton_request(run.answer, run.tag, run.limits)
    (first,) = _generate(engine, [skeleton])
    context = list(skeleton.input_ids) + list(first["output_ids"])
    return [
        first,
        *_generate(
            engine, answers.branch_requests(run.answer, run.tag, run.limits, context)
        ),
    ]


def _meta(out: dict) -> dict:
    meta = out.get("meta_info", {})
    keep = ("id", "completion_tokens", "spec_accept_length", "spec_verify_ct")
    return {k: meta.get(k) for k in keep}


def server_accept(engine) -> dict:
    """What the engine's /server_info says of acceptance: SGLang's average accept length, and
    SPECSOT's own account where it serves."""
    states = (engine.get_server_info().get("internal_states") or [{}])[0]
    specsot = states.get("specsot") or {}
    return {"avg_spec_accept_length": states.get("avg_spec_accept_length"),
            "specsot_acceptance_by_depth": specsot.get("acceptance_by_depth")}  # fmt: skip


def _serve(conn, kwargs: dict, env: dict) -> None:
    """The engine process: start the engine, then answer commands until `stop`."""
    os.environ.update(env)
    try:
        import sglang

        engine = sglang.Engine(**kwargs)
    except Exception:
        conn.send(("error", traceback.format_exc()[-3000:]))
        return
    conn.send(("ready", None))
    try:
        while True:
            command, arg = conn.recv()
            if command == "stop":
                break
            try:
                conn.send(("ok", _command(engine, command, arg)))
            except Exception:
                conn.send(("error", traceback.format_exc()[-3000:]))
    finally:
        engine.shutdown()


def _command(engine, command: str, arg):
    if command == "flush":
        return engine.flush_cache()
    if command == "time":
        return time_answer(engine, arg)
    if command == "accept":
        return server_accept(engine)
    raise ValueError(f"unknown engine command {command!r}")


class EngineHost:
    """One engine in its own process (spawned: no CUDA state is inherited), driven over a pipe."""

    def __init__(self, name: str, kwargs: dict, env: dict) -> None:
        self.name = name
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve, args=(child, kwargs, env), name=f"replay-{name}"
        )
        self.process.start()

    def wait_ready(self, timeout_s: float) -> None:
        self._reply(timeout_s, "start")

    def call(self, command: str, arg=None, timeout_s: float = 600):
        self.conn.send((command, arg))
        return self._reply(timeout_s, command)

    def _reply(self, timeout_s: float, what: str):
        if not self.conn.poll(max(timeout_s, 0)):
            raise TimeoutError(
                f"{self.name} engine: no answer to {what} within {timeout_s:.0f} s"
            )
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"{self.name} engine, {what}: {value}")
        return value

    def stop(self) -> None:
        """Shut the engine down; kill its process (and so its scheduler) if it does not end."""
        if self.process.is_alive():
            try:
                self.conn.send(("stop", None))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(STOP_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
