"""The SPECSOT worker's own part of a step: its budget mode, the requests it keeps, the step
log its telemetry writes, what /server_info shows, and what a cache flush forgets."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.speculative import requests as requests_module
from sglang_specsot.speculative import step_log
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.host_sync import Committed, PendingCommit
from sglang_specsot.speculative.policy.config import FIXED_WINDOW_ENV, AdaptiveConfig, adaptive_config, budget_mode
from sglang_specsot.speculative.policy.values import StepDecision, Verified
from sglang_specsot.speculative.requests import RequestBook
from sglang_specsot.speculative.telemetry import StepClock
from sglang_specsot.speculative.worker import VerifiedStep
from tests.unit.speculative.builders import WINDOW, batch, context_worker, cost, decide, set_target


def test_without_speculative_adaptive_every_budget_is_weighed(monkeypatch, tmp_path):
    monkeypatch.delenv(FIXED_WINDOW_ENV, raising=False)
    args = SimpleNamespace(speculative_adaptive=False, speculative_adaptive_config=None)
    config = adaptive_config(args, 5)
    assert budget_mode(args) == "adaptive" and config.candidates(1) == config.candidates(64) == (0, 1, 2, 3, 4, 5)
    worker, step = context_worker(config), batch(2)
    # Rows cost in proportion: no draft pays, so every step is a plain decode.
    assert {max(decide(worker, step).sizes) for _ in range(8)} == {1}
    # Rows free: each request drafts until its next draft is unlikely (p = 0.5 without
    # evidence: 0.5^5 < min_token_prob 0.05, so 4 drafts and the root).
    set_target(worker.cost, (1, 64), (100.0, 100.0))
    assert decide(worker, step).sizes == [5, 5] and worker.policy.last_plan.budgets == (4, 4)
    report = worker.speculative_state_report()["specsot"]
    assert report["budget_mode"] == "adaptive" and report["adaptive"] is True
    assert report["last_plan"] == {"width": 5, "budgets": [4, 4]} and report["memory"]["drafter"]["requests"] == 0
    # A config file is SGLang's: it is read with --speculative-adaptive, as SGLang reads it,
    # and refused without the flag rather than silently dropped.
    path = tmp_path / "adaptive.json"
    path.write_text('{"1": {"candidate_steps": [0, 2]}}')
    alone = SimpleNamespace(speculative_adaptive=False, speculative_adaptive_config=str(path))
    with pytest.raises(ValueError, match=r"read only with --speculative-adaptive: add --speculative-adaptive"):
        adaptive_config(alone, 5)
    with_flag = SimpleNamespace(speculative_adaptive=True, speculative_adaptive_config=str(path))
    assert adaptive_config(with_flag, 5).candidates(8) == (0, 2)


def test_the_fixed_window_is_asked_for_in_the_environment(monkeypatch):
    args = SimpleNamespace(speculative_adaptive=False, speculative_adaptive_config=None)
    monkeypatch.setenv(FIXED_WINDOW_ENV, "1")
    assert budget_mode(args) == "fixed" and adaptive_config(args, 5) is None
    # Every step drafts the whole window, whatever it costs.
    worker = context_worker(None)
    assert decide(worker, batch(3)).sizes == [WINDOW] * 3
    assert worker.speculative_state_report()["specsot"]["budget_mode"] == "fixed"
    # --speculative-adaptive wins over it: the flag is the user's explicit choice.
    adaptive = SimpleNamespace(speculative_adaptive=True, speculative_adaptive_config=None)
    assert budget_mode(adaptive) == "adaptive" and adaptive_config(adaptive, 5).candidates(1) == (0, 1, 2, 3, 4, 5)
    monkeypatch.setenv(FIXED_WINDOW_ENV, "yes")
    with pytest.raises(ValueError, match=r"SGLANG_SPECSOT_FIXED_WINDOW='yes': set it to 1"):
        budget_mode(args)


def test_malformed_tags_are_logged_a_bounded_number_of_times(caplog):
    # Each problem text quotes the client's value: a client sending ever new garbage must not
    # grow the scheduler's set of warnings without bound.
    book = RequestBook()
    for i in range(3 * requests_module._MAX_WARNED):
        req = SimpleNamespace(rid=f"r{i}", sampling_params=SimpleNamespace(custom_params={"specsot": {"role": f"junk-{i}"}}))
        assert book.read_tag(req) is not None
    assert len(book._warned) == requests_module._MAX_WARNED
    warnings = [r for r in caplog.records if "malformed SoT metadata" in r.getMessage()]
    assert len(warnings) == requests_module._MAX_WARNED and "further malformed" in warnings[-1].getMessage()


def test_a_cache_flush_forgets_the_groups_not_what_drafting_earns_here():
    # Benchmarks flush the cache between requests; a server that forgot its acceptance then
    # would be cold again at every request, and explore each role anew behind a catch-up.
    worker = context_worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25), shadows=False)
    stats = worker.policy.stats
    for _ in range(10):
        stats.observe("r0", 2, 2, "plain")
    prior = stats.priors()["plain"]  # where a new normal answer starts: {"first", "p"}
    assert stats.first("r0", "plain") > prior["first"] > 0.8
    assert stats.p("r0", "plain") > prior["p"] > 0.8
    worker.clear_cache_pool()
    assert stats.has_evidence("plain") and stats.priors()["plain"] == prior
    assert stats.info() == {}  # the group is gone: it starts where a new one would
    assert stats.first("r0", "plain") == pytest.approx(prior["first"], abs=1e-3)
    assert stats.p("r0", "plain") == pytest.approx(prior["p"], abs=1e-3)
    assert not worker.policy._cold(worker.requests.view(batch(1).reqs))


# -- the step log ------------------------------------------------------------------------------


def test_the_step_log_records_what_the_policy_chose_and_what_verify_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv(step_log.ENV, str(tmp_path / "steps.jsonl"))
    rows_free = cost((1, 64), (100.0, 100.0))
    worker = context_worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),)), rows_free, step_log=step_log.StepLog.from_env())
    step = batch(2)
    decision = decide(worker, step)
    sizes = decision.sizes
    trees = tuple(DraftTree(tuple(range(n)), tuple(range(-1, n - 1))) for n in sizes)
    clock = StepClock(catch_ups=0)  # phases of 1, 100 and 22.4 ms; the target's forward 95 ms
    clock.marks = {"start": 0.0, "draft": 0.001, "verify": 0.101, "draft_extend": 0.1234}
    clock.target_ms = 95.0
    verified = Verified(tuple(t.height for t in trees), (2, 0), "context", committed=4)
    worker.telemetry.finish(clock, Proposal(trees, "context", decision), max(sizes), verified, False, worker.drafter, [3, 1])
    (line,) = (tmp_path / "steps.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["bs"] == 2 and record["ps"] == [0.5, 0.5] and record["width"] == max(sizes) > 1
    assert record["budgets"] == record["drafted"] == [n - 1 for n in sizes]
    assert record["accepted"] == [2, 0] and record["step_ms"] == 123.4 and record["explored"] is False
    assert record["expected_ms"] == 100.0 and record["cost"] == {"target_overhead_ms": 0.0}
    assert record["draft_extend"] is None and record["candidates"]["1"] == [2.0, 100.0]
    assert record["phase_ms"] == {"draft": 1.0, "verify": 100.0, "draft_extend": 22.4, "target_forward": 95.0}


def test_no_step_log_without_its_environment_variable(monkeypatch):
    monkeypatch.delenv(step_log.ENV, raising=False)
    assert step_log.StepLog.from_env() is None


def test_a_decode_steps_phase_times_in_the_step_log_are_its_own(tmp_path, monkeypatch):
    # forward_batch_generation with the phases stubbed: each takes a known time, and the step
    # log's phase_ms must show those times.
    monkeypatch.setenv(step_log.ENV, str(tmp_path / "steps.jsonl"))
    worker = context_worker(AdaptiveConfig(buckets=((1, (0, 1)),)), step_log=step_log.StepLog.from_env())
    worker.telemetry.timed = True
    step = SimpleNamespace(reqs=[SimpleNamespace(rid="r0")], forward_mode=SimpleNamespace(is_decode=lambda: True))
    result = SimpleNamespace(accept_lens=torch.tensor([2]), next_token_ids=torch.tensor([0, 1]),
                             speculative_num_draft_tokens=2, new_seq_lens=None)  # fmt: skip
    view = worker.requests.view(step.reqs)

    def draft(batch):
        time.sleep(0.02)
        decision = StepDecision(view, worker.policy.plain_plan(1), (0.5,), (0.5,), exploring=False, adaptive=True)
        return SimpleNamespace(draft_token_num=2), Proposal((DraftTree((0, 1), (-1, 0)),), "context", decision)

    def verify(batch, verify_input, clock, pp_proxy_tensors=None, proposal=None):
        time.sleep(0.04)
        clock.target_ms = 10.0
        return result

    def draft_extend(batch, result, proposal, clock):
        step = VerifiedStep(tuple(batch.reqs), 2, proposal, clock, PendingCommit.of(result))
        step.committed, step.verified = Committed([[0, 1]], [2]), Verified((1,), (1,), "context", committed=2)
        return step

    worker.draft, worker.verify, worker.draft_extend = draft, verify, draft_extend
    assert worker.forward_batch_generation(step) is result
    (line,) = (tmp_path / "steps.jsonl").read_text().splitlines()
    phases = json.loads(line)["phase_ms"]
    assert 20.0 <= phases["draft"] < phases["verify"] and 40.0 <= phases["verify"] < 1000.0, phases
    assert 0.0 <= phases["draft_extend"] < phases["draft"] and phases["target_forward"] == 10.0, phases
    assert worker.policy.drafting_runs._length == 1  # the step counted as drafting (a window of 2)
    assert worker.policy.drafting_runs._key == "1 plain"  # under the batch's size and roles
