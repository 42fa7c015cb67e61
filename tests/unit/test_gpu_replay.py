"""The device check's replay stage (scripts/gpu_stage_replay.py, issue 85) without a GPU or an
engine: its trace folders, the requests that answer them at the recorded lengths, the accept
lengths a replay promises, the engines' arguments and the report. Its CPU smoke, which starts
engines, is tests/integration/test_gpu_replay_smoke.py (long tier)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402
import gpu_replay_answers as answers  # noqa: E402
import gpu_replay_shapes as shapes  # noqa: E402
import gpu_stage_replay as stage  # noqa: E402
from gpu_record import Recorder  # noqa: E402
from gpu_replay_answers import Limits  # noqa: E402

from sglang_specsot.speculative.trace import TraceStep  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "replay_traces"


@pytest.fixture
def folder_copy(tmp_path) -> Path:
    out = tmp_path / "traces-x"
    shutil.copytree(FIXTURE, out)
    return out


def _rewrite_answer(folder: Path, **changes) -> None:
    path = folder / "answers.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0].update(changes)
    for key in [k for k, v in changes.items() if v is ...]:
        del rows[0][key]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# --- the folder --------------------------------------------------------------------------------


def test_the_fixture_folder_loads_one_frozen_shape_per_question():
    folder = answers.load_trace_folder(FIXTURE)
    assert [a.question_id for a in folder.answers] == ["q1", "q2", "q3"]
    q1, q2, q3 = folder.answers
    assert (
        q1.branches == 2
        and q1.branch_suffix_tokens == (6, 8)
        and q1.specsot_rid == "n1"
    )
    assert q2.branch_suffix_tokens == (5, 5, 5)  # one count for all branches
    assert q3.specsot_rid is None and q3.branch_rids == ("b3a",)
    assert set(folder.trace) >= {"n1", "s1", "b1a", "b1b", "n2", "s2", "s3"}
    with pytest.raises(AttributeError):
        q1.plain_tokens = 1  # frozen


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"plain_tokens": ...}, r"missing fields \['plain_tokens'\]"),
        ({"plain_tokens": -1}, "plain_tokens must be a count"),
        ({"skeleton_tokens": True}, "skeleton_tokens must be a count"),
        ({"branch_rids": ["b1a"]}, "2 branch_tokens and 1 branch_rids"),
        ({"branch_suffix_tokens": [1, 2, 3]}, "3 branch_suffix_tokens for 2 branches"),
        (
            {"skeleton_rid": "nowhere"},
            r"names rids \['nowhere'\] that trace.jsonl does not have",
        ),
    ],
)
def test_a_malformed_answer_is_refused_naming_its_line_and_field(
    folder_copy, changes, message
):
    _rewrite_answer(folder_copy, **changes)
    with pytest.raises(ValueError, match=message):
        answers.load_trace_folder(folder_copy)


def test_the_shapes_writer_s_own_forms_load_a_question_without_sot_and_an_untraced_branch(
    folder_copy,
):
    # sglang_specsot/bench/trace_shapes.py: int question ids, one suffix count for all branches,
    # no SoT answer as null / 0 / empty, a branch traced under no rid as "".
    _rewrite_answer(folder_copy, question_id=7, skeleton_rid=None, skeleton_tokens=0, branch_tokens=[],
                    branch_rids=[], branch_suffix_tokens=0)  # fmt: skip
    rows = [
        json.loads(line)
        for line in (folder_copy / "answers.jsonl").read_text().splitlines()
    ]
    rows[1]["branch_rids"][1] = ""
    (folder_copy / "answers.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    first, second, _ = answers.load_trace_folder(folder_copy).answers
    assert (first.question_id, first.skeleton_rid, first.branches, first.complete) == (
        "7",
        None,
        0,
        False,
    )
    assert second.complete and second.branch_rids == ("b2a", "", "b2c")
    assert [a.question_id for a in answers.measured_answers([first, second], 2)] == [
        "q2",
        "q2",
    ]
    branches = answers.branch_requests(second, "m0", Limits(vocab=500), (5,) * 4)
    assert [b.rid for b in branches] == [
        "b2a@m0",
        "untraced-q2-branch1@m0",
        "b2c@m0",
    ]  # distinct, replays nothing


def test_a_folder_without_its_files_or_with_a_bad_trace_is_refused(folder_copy):
    (folder_copy / "trace.jsonl").write_text('{"rid": "a", "width": 1}\n')
    with pytest.raises(ValueError, match="not a trace of TraceStep lines"):
        answers.load_trace_folder(folder_copy)
    (folder_copy / "trace.jsonl").unlink()
    with pytest.raises(ValueError, match="has no trace.jsonl"):
        answers.load_trace_folder(folder_copy)
    with pytest.raises(ValueError, match="answers.jsonl:1: "):
        (folder_copy / "trace.jsonl").write_text("")
        (folder_copy / "answers.jsonl").write_text("{}\n")
        answers.load_trace_folder(folder_copy)


def test_the_newest_traces_folder_is_the_default(tmp_path):
    with pytest.raises(ValueError, match="--traces DIR"):
        answers.newest_trace_folder(tmp_path)
    for name, mtime in (("traces-old", 100), ("traces-new", 200), ("other", 300)):
        shutil.copytree(FIXTURE, tmp_path / name)
        os.utime(tmp_path / name / "answers.jsonl", (mtime, mtime))
    assert answers.newest_trace_folder(tmp_path).name == "traces-new"


# --- the plans -----------------------------------------------------------------------------------


def test_measured_answers_cycle_the_traced_questions_and_warm_up_takes_each_branch_count():
    folder = answers.load_trace_folder(FIXTURE)
    assert [a.question_id for a in answers.measured_answers(folder.answers, 5)] == [
        "q1",
        "q2",
        "q1",
        "q2",
        "q1",
    ]
    assert [a.question_id for a in answers.warmup_answers(folder.answers)] == [
        "q1",
        "q2",
    ]  # q3: not traced
    with pytest.raises(ValueError, match="no question has both a traced normal answer"):
        answers.measured_answers(folder.answers[2:], 8)


def test_requests_have_the_recorded_lengths_tagged_rids_and_the_same_prompts_every_pass():
    q1 = answers.load_trace_folder(FIXTURE).answers[0]
    limits = Limits(vocab=500)
    normal = answers.normal_request(q1, "m3", limits)
    assert (
        normal.rid == "n1@m3"
        and len(normal.input_ids) == 30
        and normal.max_new_tokens == 24
    )
    assert normal.params() == {
        "temperature": 0.0,
        "max_new_tokens": 24,
        "ignore_eos": True,
    }
    assert all(answers.FIRST_PROMPT_ID <= t < 500 for t in normal.input_ids)
    assert (
        answers.normal_request(q1, "w0", limits).input_ids == normal.input_ids
    )  # only the rid changes
    skeleton = answers.skeleton_request(q1, "m3", limits)
    assert (skeleton.rid, len(skeleton.input_ids), skeleton.max_new_tokens) == (
        "s1@m3",
        40,
        12,
    )
    context = skeleton.input_ids + (7,) * 12  # the skeleton's prompt and output
    branches = answers.branch_requests(q1, "m3", limits, context)
    assert [b.rid for b in branches] == ["b1a@m3", "b1b@m3"]
    assert [b.max_new_tokens for b in branches] == [14, 10]
    assert [len(b.input_ids) for b in branches] == [50 + 6, 50 + 8]
    assert all(
        b.input_ids[:50] == context[:50] for b in branches
    )  # the shared prefix is the skeleton's context
    assert branches[0].input_ids[50:] != branches[1].input_ids[50:]


def test_a_short_skeleton_context_is_filled_and_the_smoke_caps_every_length():
    q2 = answers.load_trace_folder(FIXTURE).answers[1]
    branches = answers.branch_requests(q2, "t", Limits(vocab=500), (9, 9, 9))
    assert all(
        len(b.input_ids) == 44 + 5 and b.input_ids[:3] == (9, 9, 9) for b in branches
    )
    assert branches[0].input_ids[:44] == branches[2].input_ids[:44]
    capped = Limits(vocab=500, max_new=10, max_prompt=16)
    assert [
        len(b.input_ids) for b in answers.branch_requests(q2, "t", capped, (9,) * 40)
    ] == [16 + 5] * 3
    assert answers.normal_request(q2, "t", capped).max_new_tokens == 10
    assert Limits(vocab=10, max_new=5).new(0) == 1  # never a zero-token request
    assert (
        Limits(vocab=10).capped(64).new(100) == 64
        and capped.capped(64) == capped
        and capped.capped(None) is capped
    )


# --- what the trace promises -------------------------------------------------------------------


def _step(accepted: int) -> TraceStep:
    parents = tuple(range(-1, accepted))  # a chain as deep as what it accepted
    return TraceStep("r", len(parents), parents, accepted, accepted)


def test_the_served_accept_length_counts_the_prefill_token_and_plain_steps_past_the_trace():
    steps = [_step(2), _step(0), _step(3)]
    assert answers.served_accept_length(steps, 1 + 3 + 1 + 4) == 9 / 3
    assert answers.served_accept_length(steps, 5) == 5 / 2  # cut at the second step
    assert (
        answers.served_accept_length(steps, 12) == 12 / 6
    )  # three plain steps after the trace
    assert answers.served_accept_length([], 1) == 1.0


def test_the_mean_accept_length_standalone_depth_and_specsot_window():
    trace = {"a": [_step(2), _step(0)], "b": [_step(3)]}
    assert answers.mean_accept_length(trace, ["a", "b"]) == pytest.approx(1 + 5 / 3)
    assert answers.standalone_steps(2.6) == 3 and answers.standalone_steps(4.2) == 4
    assert answers.tree_window(trace) == (4, 3)
    with pytest.raises(ValueError, match="no steps"):
        answers.mean_accept_length({"a": []}, ["a"])


def test_the_summary_gives_medians_and_both_ratios():
    report = answers.summary(
        {
            "plain": [2.0, 4.0, 3.0],
            "SoT-only": [1.5],
            "SpecSoT": [0.5, 1.0],
            "SPECSOT": [],
        }
    )
    assert report["configs"]["plain"] == {
        "median_s": 3.0,
        "answers": 3,
        "speed_vs_plain": 1.0,
    }
    assert (
        report["configs"]["SpecSoT"]["speed_vs_plain"] == 4.0
        and "SPECSOT" not in report["configs"]
    )
    assert report["specsot_vs_sot"] == 2.0
    assert answers.summary({"SpecSoT": [1.0]})["specsot_vs_sot"] is None


# --- the stage ---------------------------------------------------------------------------------


def test_the_replay_stage_runs_only_where_named_within_its_own_run():
    assert "replay" not in gpu_check.selected_stages()
    assert gpu_check.selected_stages() == {
        n: s for n, s in gpu_check.STAGE_LIMITS.items() if n != "replay"
    }
    assert (
        gpu_check.STAGE_LIMITS["replay"] <= 300
        and gpu_check.STAGE_LIMITS["replay"] + gpu_check.SETUP_S
        <= gpu_check.RUN_BUDGET_S
    )


def test_the_stage_list_takes_replay_where_named(monkeypatch):
    monkeypatch.setenv("SPECSOT_GPU_STAGES", "replay")
    assert gpu_check.selected_stages(smoke=True) == {
        "replay": 300 * gpu_check.SMOKE_SLOWER
    }


def test_the_engines_replay_the_trace_and_standalone_simulates_its_mean(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)  # the device's arguments
    folder = answers.load_trace_folder(FIXTURE)
    dirs = shapes.pair_dirs(shapes.DEVICE_PAIRS["7b"], "bfloat16", tmp_path)
    vocab = {
        k: json.loads((d / "config.json").read_text())["vocab_size"]
        for k, d in dirs.items()
    }
    assert vocab == {"target": 152064, "draft": 151936, "standalone_draft": 152064}
    target = json.loads((dirs["target"] / "config.json").read_text())
    assert (
        target["num_hidden_layers"],
        target["hidden_size"],
        target["tie_word_embeddings"],
    ) == (28, 3584, False)
    specs = shapes.engine_specs(folder, dirs, shapes.DEVICE_REPLAY, max_bs=3)
    assert list(specs) == ["plain", "standalone", "specsot"]
    (plain, _), (standalone, sa_env), (specsot, sp_env) = specs.values()
    normal = [a.specsot_rid for a in folder.answers if a.specsot_rid]
    assert float(sa_env["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(
        answers.mean_accept_length(folder.trace, normal), abs=1e-4
    )
    assert (
        standalone["speculative_draft_model_path"] == str(dirs["standalone_draft"])
        and standalone["speculative_eagle_topk"] == 1
    )
    assert (
        sp_env["SGLANG_SPECSOT_REPLAY"] == str(FIXTURE / "trace.jsonl")
        and sp_env["SGLANG_SPECSOT_REPLAY_OPT_IN"] == "forced-acceptance"
    )
    assert (
        specsot["speculative_draft_model_path"] == str(dirs["draft"])
        and specsot["speculative_num_draft_tokens"] == 4
    )
    for kwargs in (plain, standalone, specsot):
        assert (
            kwargs["load_format"] == "dummy"
            and kwargs["dtype"] == "bfloat16"
            and kwargs["skip_tokenizer_init"]
        )
    assert (
        plain["attention_backend"] == "triton"
        and plain["cuda_graph_max_bs_decode"] == 3
    )
    assert "disable_cuda_graph" not in plain  # graphs on
    shares = [kwargs["mem_fraction_static"] for kwargs in (plain, standalone, specsot)]
    assert shares == [
        0.25,
        0.375,
        0.75,
    ]  # each of what is free at its start: about a quarter of the GPU each


def test_the_smoke_without_engines_plans_every_request(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    out = tmp_path / "out.jsonl"
    stage.stage_replay(
        Recorder(out, "replay"),
        smoke=True,
        limit_s=60,
        traces=FIXTURE,
        pairs=["1.5b", "7b"],
    )
    last = json.loads(out.read_text().splitlines()[-1])
    assert (
        last["status"] == "ok"
        and last["smoke"]
        and last["planned"] == 2 * ((2 + 2) + (2 + 3))
    )  # q1, q2 per pair
    with pytest.raises(ValueError, match="known: 1.5b, 7b"):
        stage.stage_replay(
            Recorder(out, "replay"),
            smoke=True,
            limit_s=60,
            traces=FIXTURE,
            pairs=["13b"],
        )


# --- a pair's run, on stand-in engines ---------------------------------------------------------


class _Engine:
    """An engine host that answers at once, as a replay would: each request its recorded
    length, SPECSOT's at the accept length its trace promises (`faithful`)."""

    def __init__(
        self,
        name: str,
        trace: dict,
        fails: type[Exception] | None = None,
        faithful: bool = True,
    ):
        self.name, self.trace, self.fails, self.faithful, self.calls = (
            name,
            trace,
            fails,
            faithful,
            [],
        )

    def call(self, command, arg=None, timeout_s=600):
        self.calls.append(command)
        if self.fails is not None and command == "time":
            raise self.fails(f"{self.name} broke")
        if command != "time":
            return {"avg_spec_accept_length": None}
        a, limits = arg.answer, arg.limits
        if arg.sot:
            skeleton = answers.skeleton_request(a, arg.tag, limits)
            requests = [
                skeleton,
                *answers.branch_requests(a, arg.tag, limits, skeleton.input_ids),
            ]
        else:
            requests = [answers.normal_request(a, arg.tag, limits)]
        return stage.Timed(
            0.5 if self.name == "specsot" else 1.0,
            tuple(self._meta(r) for r in requests),
        )

    def _meta(self, request):
        meta = {"completion_tokens": request.max_new_tokens, "spec_accept_length": None}
        if self.name == "specsot":
            recorded = request.rid.rpartition("@")[0]
            promised = answers.served_accept_length(
                self.trace[recorded], request.max_new_tokens
            )
            meta["spec_accept_length"] = promised if self.faithful else 1.0
        return meta

    def stop(self):
        pass


def _pair_run(tmp_path, engines: dict, deadline_s: float = 600):
    import time

    folder = answers.load_trace_folder(FIXTURE)
    run = stage.PairRun(Recorder(tmp_path / "out.jsonl", "replay"), "1.5b", folder, shapes.SMOKE_REPLAY,
                        time.monotonic() + deadline_s)  # fmt: skip
    run.engines = {
        name: engines.get(name) or _Engine(name, folder.trace)
        for name in ("plain", "standalone", "specsot")
    }
    return run


def test_a_pair_times_every_configuration_and_the_replay_holds_its_promise(tmp_path):
    run = _pair_run(tmp_path, {})
    assert run.measure() == 2 and all(len(v) == 2 for v in run.latencies.values())
    report, problem = stage.accept_report(run, simulated=2.0)
    assert (
        problem is None and report["SpecSoT"]["served"] == report["SpecSoT"]["promised"]
    )
    summary = answers.summary(run.latencies)
    assert (
        summary["configs"]["SPECSOT"]["speed_vs_plain"] == 2.0
        and summary["specsot_vs_sot"] == 2.0
    )
    assert run.engines["plain"].calls[:2] == [
        "flush",
        "time",
    ]  # a flushed cache before every answer


def test_a_replay_that_does_not_serve_the_traced_lengths_fails(tmp_path):
    folder = answers.load_trace_folder(FIXTURE)
    run = _pair_run(
        tmp_path, {"specsot": _Engine("specsot", folder.trace, faithful=False)}
    )
    run.measure()
    _, problem = stage.accept_report(run, simulated=2.0)
    assert problem.startswith(
        "SPECSOT served accept length 1.0 where the trace promises"
    )


def test_a_failing_engine_is_left_out_and_the_deadline_stops_the_pair(tmp_path):
    folder = answers.load_trace_folder(FIXTURE)
    run = _pair_run(
        tmp_path,
        {"standalone": _Engine("standalone", folder.trace, fails=RuntimeError)},
    )
    assert run.measure() == 2
    assert (
        "RuntimeError: standalone broke" in run.broken["standalone"]
        and run.latencies["STANDALONE"] == []
    )
    assert run.engines["standalone"].calls == ["flush", "time"]  # not asked again
    assert len(run.latencies["SpecSoT"]) == 2
    timing_out = _pair_run(
        tmp_path, {"plain": _Engine("plain", folder.trace, fails=TimeoutError)}
    )
    with pytest.raises(TimeoutError):
        timing_out.measure()
    late = _pair_run(tmp_path, {}, deadline_s=-1)
    assert late.measure() == 0  # no time for a round: nothing started


def test_the_lines_bench_trace_shapes_writes_parse():
    from sglang_specsot.bench.trace_shapes import AnswerShape as Written

    rids = ("specsot-ab-branch1-2", "")
    line = Written(
        3,
        40,
        30,
        "SPECSOT-q3-y",
        12,
        50,
        "specsot-ab-skeleton-1",
        (20, 25),
        rids,
        140,
        11,
    ).to_json()
    shape = answers.parse_answer(json.loads(line))
    assert (shape.question_id, shape.branch_rids, shape.branch_suffix_tokens) == (
        "3",
        rids,
        (11, 11),
    )
    assert shape.complete
    without_sot = answers.parse_answer(json.loads(Written(4, 40, 30, None).to_json()))
    assert without_sot.skeleton_rid is None and not without_sot.complete
