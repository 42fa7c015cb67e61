"""The runner's schedules with fake servers: all up and interleaved, or one at a time in
rounds over question blocks; a server that does not start fails its cells with the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sglang_specsot.bench import runner
from sglang_specsot.bench.cells import Question, Settings
from sglang_specsot.bench.configs import select, matrix, servers
from sglang_specsot.bench.store import FAILED, OK, CellResult, load

QUESTIONS = (Question(1, "q1", True), Question(2, "q2", True), Question(3, "q3", False))


class FakeProc:
    returncode = None

    def poll(self):
        return self.returncode


class FakeServer:
    def __init__(self, name, log):
        self.name, self.base_url, self.proc, self.log_path, self.stopped = name, f"http://{name}", FakeProc(), "x", False
        log.append(("start", name))
        log.append(("server", name, self))

    def stop(self):
        self.stopped = True

    def get(self, path, timeout=60.0):
        assert path == "/server_info" and not self.stopped
        if self.name == "ngram":
            raise OSError("connection refused")  # a server that does not answer: no state, no failure
        return {"internal_states": [{"specsot": {"drafting_runs": {"5": {"steps": 2.0}}}} if "specsot" in self.name else {}]}


@pytest.fixture
def fake_world(monkeypatch):
    log: list = []
    broken: set = set()

    def start(plan, name):
        if name in broken:
            raise RuntimeError(f"SGLang server exited with code 1 during start-up; last log lines:\nboom {name}")
        return FakeServer(name, log)

    def run_cell(cfg, question, target, settings):
        log.append(("cell", question.id, cfg.name, target.url))
        return CellResult(question.id, cfg.name, OK, question.suitable, latency=1.0, answer="a")

    monkeypatch.setattr(runner, "_start", start)
    monkeypatch.setattr(runner, "run_cell", run_cell)
    monkeypatch.setattr("sglang_specsot.frontend.chat_renderer", lambda path: (lambda messages: ""))
    return log, broken


def plan(tmp_path, one_at_a_time: bool, block: int = 2) -> runner.RunPlan:
    configs = select(matrix(False), ["NGRAM", "SpecSoT-server", "SpecSoT-router"])
    return runner.RunPlan("/m", "float32", servers(None), tuple(configs), QUESTIONS, tmp_path,
                          Settings(16, 5), one_at_a_time, block)  # fmt: skip


def test_all_servers_up_interleaves_every_configuration_per_question(tmp_path, fake_world):
    log, _ = fake_world
    assert runner.run(plan(tmp_path, one_at_a_time=False)) == 3 * 3 + 1
    starts = [e for e in log if e[0] == "start"]
    assert len(starts) == 3  # plain, ngram, specsot-ctx, each once
    questions = [e[1] for e in log if e[0] == "cell"]
    assert questions == sorted(questions)  # question by question
    assert [e[2] for e in log if e[0] == "cell"][:3] != [e[2] for e in log if e[0] == "cell"][3:6]  # rotated
    assert runner.run(plan(tmp_path, one_at_a_time=False)) == 0  # resumed: nothing left


def test_one_at_a_time_runs_rounds_over_blocks(tmp_path, fake_world):
    log, _ = fake_world
    runner.run(plan(tmp_path, one_at_a_time=True, block=2))
    # Block 1 (q1, q2) then block 2 (q3): each server started once per block, alone.
    starts = [e[1] for e in log if e[0] == "start"]
    assert len(starts) == 6 and set(starts[:3]) == set(starts[3:]) and starts[:3] != starts[3:]
    assert starts[:3] == ["plain", "specsot-ctx", "ngram"]  # the headline pair first, then rotated
    first_block = log[: log.index(("start", starts[3]))]
    assert {e[1] for e in first_block if e[0] == "cell"} == {1, 2}


def test_a_server_that_does_not_start_fails_its_cells_and_the_run_goes_on(tmp_path, fake_world):
    log, broken = fake_world
    broken.add("ngram")
    runner.run(plan(tmp_path, one_at_a_time=False))
    cells = load(tmp_path / "cells.jsonl")
    ngram = [c for (q, name), c in cells.items() if name == "NGRAM"]
    assert len(ngram) == 3 and all(c.status == FAILED and "server ngram did not start" in c.reason for c in ngram)
    assert all(c.status == OK for (q, name), c in cells.items() if name != "NGRAM")


def test_a_server_that_fails_to_start_is_tried_once_more(tmp_path, monkeypatch):
    attempts, envs = [], []

    class FlakyServer:
        def __init__(self, model_path, args, env=None, log_path=None, startup_timeout=0):
            self.args, self.env = args, env

        def start(self):
            attempts.append(self.args)
            envs.append(self.env)
            if len(attempts) == 1:
                raise RuntimeError("SGLang server exited with code -9 during start-up")
            return self

        def stop(self):
            pass

    monkeypatch.setattr("sglang_specsot.launch.ServerProcess", FlakyServer)
    monkeypatch.setattr(runner, "RETRY_PAUSE", 0)
    server = runner._start(plan(tmp_path, one_at_a_time=True), "plain")
    assert len(attempts) == 2 and isinstance(server, FlakyServer)
    assert attempts[0][attempts[0].index("--mem-fraction-static") + 1] == runner.MEM_FRACTION
    # The plain server delays sampling, so SoT on it gets the skeleton constraint too.
    assert envs[0] == {"SGLANG_ENABLE_DELAY_SAMPLE": "1"} and "--enable-custom-logit-processor" in attempts[0]


def test_sot_cells_are_constrained_wherever_the_server_side_rule_constrains():
    specs = servers("/draft")
    constrained = {name: runner.skeleton_constrained(spec) for name, spec in specs.items()}
    assert constrained == {"plain": True, "ngram": False, "specsot-ctx": True, "standalone": False, "specsot": True}


def test_a_server_that_dies_is_restarted_once_then_its_cells_fail(tmp_path, fake_world, monkeypatch):
    log, _ = fake_world
    deaths = iter([True, True, False, False])  # dies after its 1st cell, again after its 2nd (restarted)

    def run_cell(cfg, question, target, settings):
        server = [e[2] for e in log if e[0] == "server" and e[1] == cfg.server][-1]
        if cfg.server == "ngram" and next(deaths):
            server.proc.returncode = -9
        log.append(("cell", question.id, cfg.name, target.url))
        return CellResult(question.id, cfg.name, OK, question.suitable, latency=1.0, answer="a")

    monkeypatch.setattr(runner, "run_cell", run_cell)
    runner.run(plan(tmp_path, one_at_a_time=False))
    assert [e[1] for e in log if e[0] == "start"].count("ngram") == 2
    ngram = sorted((q, c.status, c.reason) for (q, name), c in load(tmp_path / "cells.jsonl").items() if name == "NGRAM")
    assert [s for _, s, _ in ngram] == [OK, OK, FAILED]
    assert "server ngram exited with code -9" in ngram[2][2]


def test_an_interrupt_while_a_server_starts_stops_it(tmp_path, monkeypatch):
    stopped = []

    class SlowServer:
        def __init__(self, model_path, args, env=None, log_path=None, startup_timeout=0):
            pass

        def start(self):
            raise KeyboardInterrupt  # SIGTERM arrives while the server loads

        def stop(self):
            stopped.append(True)

    monkeypatch.setattr("sglang_specsot.launch.ServerProcess", SlowServer)
    with pytest.raises(KeyboardInterrupt):
        runner._start(plan(tmp_path, one_at_a_time=True), "plain")
    assert stopped == [True]


def test_warm_up_asks_each_fresh_server_once_per_kind_untimed_and_unrecorded(tmp_path, fake_world, monkeypatch):
    log, _ = fake_world
    settings_seen = []

    def run_cell(cfg, question, target, settings):
        log.append(("cell", question.id, cfg.name, target.url))
        settings_seen.append((question.id, settings.max_tokens))
        status = FAILED if question.id < 0 and cfg.server == "ngram" else OK  # a failed warm-up is only logged
        return CellResult(question.id, cfg.name, status, question.suitable, latency=1.0, answer="a", reason="x")

    monkeypatch.setattr(runner, "run_cell", run_cell)
    runner.run(replace(plan(tmp_path, one_at_a_time=True, block=2), warm_up=True))
    cells = [e for e in log if e[0] in ("start", "cell")]
    warm = [e for e in cells if e[0] == "cell" and e[1] < 0]
    # Two blocks x three servers, one kind of cell each: specsot-ctx serves two configurations
    # (SpecSoT-server and SpecSoT-router), both server-side SoT, so it is warmed once.
    assert len(warm) == 6
    for i, event in enumerate(cells):  # every start is followed by its warm-up, before any measured cell
        if event[0] == "start":
            assert cells[i + 1][:2] == ("cell", -1) and cells[i + 1][3] == f"http://{event[1]}"
    assert all(tokens == runner.WARM_UP_TOKENS for qid, tokens in settings_seen if qid < 0)
    assert all(tokens == 16 for qid, tokens in settings_seen if qid >= 0)
    recorded = load(tmp_path / "cells.jsonl")
    assert {q for q, _ in recorded} == {1, 2, 3} and all(c.status == OK for c in recorded.values())


def test_each_specsot_servers_policy_state_is_kept_as_it_stops(tmp_path, fake_world):
    import json

    runner.run(plan(tmp_path, one_at_a_time=False))
    lines = [json.loads(x) for x in (tmp_path / runner.STATE_FILE).read_text().splitlines()]
    # plain has no SPECSOT state and ngram did not answer: the SPECSOT context server's is kept.
    assert [x["server"] for x in lines] == ["specsot-ctx"]
    assert lines[0]["specsot"] == {"drafting_runs": {"5": {"steps": 2.0}}} and lines[0]["stopped"]
