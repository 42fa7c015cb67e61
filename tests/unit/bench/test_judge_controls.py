from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import Counter

from sglang_specsot.bench import judge_controls as jc
from sglang_specsot.bench.chat_judge import ChatJudge, chat_route, read_verdict
from sglang_specsot.bench.endings import split_points
from sglang_specsot.bench.metrics import sentences

TIPS = ("Preparing for a job interview takes some planning. Here are some tips:\n\n"
        "1. **Research the company**: Read the company's website and recent news. Know what the company makes.\n\n"
        "2. **Practice common questions**: Rehearse answers to common questions aloud. Ask a friend to practice as the interviewer.\n\n"
        "3. **Dress appropriately**: Choose clothes that fit the dress code of the place.\n\n"
        "4. **Prepare to ask**: Prepare to ask about the team and the role. It shows you prepared.\n\n"
        "Good preparation makes an interview less stressful.")
FASHION = ("Fast fashion harms the environment in several ways:\n\n"
           "1. **Water use**: Growing cotton and dyeing fabric use vast amounts of water.\n\n"
           "2. **Waste**: Cheap clothes are worn briefly and end as waste in landfills.\n\n"
           "3. **Emissions**: Production and shipping cause emissions of greenhouse gases.")
SLEEP = ("Better sleep starts with habits:\n\n1. **Keep a schedule**: Keep the same bedtime every night.\n\n"
         "2. **Limit screens**: Blue light from screens delays sleep.\n\n3. **Avoid caffeine late**: Caffeine stays in the body for hours.")
NORMALS = [jc.NormalAnswer(1, "How should I prepare for a job interview?", TIPS),
           jc.NormalAnswer(2, "What are the environmental consequences of fast fashion?", FASHION),
           jc.NormalAnswer(3, "How can I improve my sleep?", SLEEP)]
# A 1.5B's answer that turns into a loop in its last point: its first half is the better answer.
LOOPING = ("Saving money takes a plan:\n\n1. **Budget**: Write down what you spend each month.\n\n"
           "2. **Cook at home**: Restaurants cost more than groceries.\n\n"
           "3. **Cut subscriptions**: Cancel the ones you do not use, and the costs go down, and the costs go down, "
           "and the costs go down, and the costs go down, and the costs go down")


def always_a(question: str, a: str, b: str) -> str:
    return "A"


def reads_content(question: str, a: str, b: str) -> str:
    """Prefers the answer on the question's topic, then the one that says no sentence twice, then
    the one whose points' sentences are about their titles (share a word stem), then more words."""
    stems = lambda t: {w[:5] for w in re.findall(r"[a-z]{4,}", t.lower())}  # noqa: E731

    def merit(answer: str) -> tuple[int, int, int, int]:
        said = sentences(answer)
        on_title = sum(bool(stems(p.split("\n")[0].split("**")[1 if "**" in p else 0]) & stems(s))
                       for p in split_points(answer) for s in sentences(p.split("**:", 1)[-1]))  # fmt: skip
        return len(stems(question) & stems(answer)), len(set(said)) - len(said), on_title, len(answer.split())

    return "A" if merit(a) > merit(b) else "B" if merit(b) > merit(a) else "tie"


def test_every_control_is_worse_than_its_answer_and_built_from_it():
    pairs = jc.control_pairs(NORMALS)
    assert {(p.question_id, p.kind) for p in pairs} == {(n.question_id, k) for n in NORMALS for k in jc.KINDS}
    by = {(p.question_id, p.kind): p.control for p in pairs}
    assert by[(1, jc.OTHER_QUESTION)] == FASHION and by[(3, jc.OTHER_QUESTION)] == TIPS
    repeated = by[(1, jc.REPEATED)]
    assert repeated.startswith("Preparing for a job interview") and repeated.endswith("less stressful.")
    assert re.findall(r"^(\d+)\. ", repeated, re.M) == [str(i) for i in range(1, 7)]  # 4 points + 2 again
    scrambled = by[(1, jc.SCRAMBLED)]
    assert scrambled.startswith("Preparing for a job interview") and scrambled.endswith("less stressful.")


def _bodies(text: str) -> Counter:
    """The answer's sentences without a title ("Title: first sentence" -> "first sentence")."""
    return Counter(s.split(": ", 1)[-1] for s in sentences(text) if not s.endswith(":"))  # not a bare title


def _point_of(text: str) -> dict[str, int]:
    return {s: i for i, point in enumerate(split_points(text)) for s in _bodies(point)}


def test_repeated_points_keeps_every_sentence_and_says_two_points_again():
    for seed in range(10):
        control = jc.repeated_points(TIPS, random.Random(seed))
        assert not Counter(sentences(TIPS)) - Counter(sentences(control))  # every sentence of the answer
        assert len(split_points(control)) == len(split_points(TIPS)) + 2
        assert re.findall(r"^(\d+)\. ", control, re.M) == [str(i) for i in range(1, 7)]  # consecutive
        extra = Counter(sentences(control)) - Counter(sentences(TIPS))
        assert set(extra) <= set(sentences(TIPS)) and len(set(split_points(control))) >= 4  # only repeats
        assert control.endswith("Good preparation makes an interview less stressful.")  # the closing stays last
    assert jc.repeated_points(TIPS, random.Random(3)) == jc.repeated_points(TIPS, random.Random(3))
    assert len({jc.repeated_points(TIPS, random.Random(s)) for s in range(10)}) > 1


def test_scrambled_sentences_keeps_every_sentence_and_moves_half_to_other_points():
    for seed in range(10):
        control = jc.scrambled_sentences(TIPS, random.Random(seed))
        assert _bodies(control) == _bodies(TIPS)  # every sentence, each once
        assert [p.split(":")[0] for p in split_points(control)] == [p.split(":")[0] for p in split_points(TIPS)]
        before, after = _point_of(TIPS), _point_of(control)
        body = [s for s in before if not s.startswith("Good preparation") and s not in
                {"Research the company", "Practice common questions"}]  # fmt: skip
        moved = sum(before[s] != after[s] for s in body)
        assert moved >= len(body) / 2 - 1  # a title's first sentence counts as its own: allow one
    assert jc.scrambled_sentences(TIPS, random.Random(3)) == jc.scrambled_sentences(TIPS, random.Random(3))
    assert len({jc.scrambled_sentences(TIPS, random.Random(s)) for s in range(10)}) > 1


def test_an_answer_with_fewer_than_three_points_builds_neither_control():
    two = "Two reasons:\n\n1. **Cost**: It is cheap. It lasts.\n\n2. **Speed**: It is fast. It scales."
    for build in (jc.repeated_points, jc.scrambled_sentences):
        assert build(two, random.Random(0)) is None
        assert build("One paragraph, no points.", random.Random(0)) is None
    assert jc.scrambled_sentences("Benefits:\n1. Fast.\n2. Simple.\n3. Free.", random.Random(0)) is None  # no body


def test_only_sound_answers_build_controls_and_the_rest_are_reported():
    cut = jc.NormalAnswer(4, "How do I learn to cook?", TIPS.replace("Good preparation", "Good prep"), "length")
    short = jc.NormalAnswer(5, "What is a bond?", "A bond is a loan to a company.\n\n1. It pays interest.\n2. It ends.")
    looped = jc.NormalAnswer(6, "How do I save money?", TIPS, looped=True)  # the run found a loop
    sound, excluded = jc.sound_answers([*NORMALS, cut, short, looped])
    assert [n.question_id for n in sound] == [1, 2, 3]
    assert excluded == {4: jc.CUT, 5: jc.FEW_POINTS, 6: jc.LOOPED}
    assert {p.question_id for p in jc.control_pairs([*NORMALS, cut, short, looped])} == {1, 2, 3}
    line = jc.describe_sound(3, excluded)
    assert line.startswith("Controls built from 3 of 6 normal answers") and "1 looped (questions 6)" in line


def test_a_looping_answer_builds_no_control_though_its_record_missed_the_loop():
    # The old controls cut this answer's sentences in half: a "first half" without the loop,
    # the better answer, asked as the worse one. Now the loop is found in the text and the
    # answer is left out, with every control made from it.
    normal = jc.NormalAnswer(7, "How do I save money?", LOOPING)
    assert jc.unsound(normal) == jc.LOOPED
    pairs = jc.control_pairs([*NORMALS, normal])
    assert all(p.question_id != 7 and p.control != LOOPING for p in pairs)
    assert {p.question_id for p in pairs if p.kind == jc.REPEATED} == {1, 2, 3}


def test_a_judge_that_always_answers_a_fails_the_controls():
    controls = jc.ask_controls(always_a, jc.control_pairs(NORMALS))
    real = [(always_a("q", "x", "y"), always_a("q", "y", "x"))] * 4
    result = jc.score(controls, real)
    assert result.control_share == 0.5 and result.consistent_share == 0.0
    assert not result.passes
    assert "FAILS" in jc.describe("always-A", result)


def test_a_judge_that_reads_content_passes_the_controls():
    controls = jc.ask_controls(reads_content, jc.control_pairs(NORMALS))
    real = [(reads_content(n.question, n.answer, m.answer), reads_content(n.question, m.answer, n.answer))
            for n, m in zip(NORMALS, NORMALS[1:])]  # fmt: skip
    result = jc.score(controls, real)
    assert result.control_share == 1.0 and result.consistent_share == 1.0
    assert result.passes and "passes" in jc.describe("reader", result)
    assert jc.by_kind(controls) == {k: (6, 6) for k in jc.KINDS}


def test_the_bars_are_exact_and_no_evidence_does_not_pass():
    assert jc.ControlScore(10, 9, 5, 4).passes
    assert not jc.ControlScore(10, 8, 5, 5).passes
    assert not jc.ControlScore(10, 10, 5, 3).passes
    assert not jc.ControlScore(0, 0, 5, 5).passes and not jc.ControlScore(10, 10, 0, 0).passes
    assert "no controls" in jc.describe("x", None)
    line = jc.describe("x", jc.ControlScore(0, 0, 12, 0))
    assert "no control pair asked" in line and "0/12 real pairs (0%)" in line and "FAILS" in line


def test_order_consistency_names_the_same_answer_in_both_orders():
    assert jc.order_consistent("A", "B") and jc.order_consistent("tie", "tie")
    assert not jc.order_consistent("A", "A") and not jc.order_consistent(None, None) and not jc.order_consistent("A", "tie")


def test_read_verdict_takes_the_last_verdict_line_else_the_first_word():
    assert read_verdict("A is longer, but B is correct.\nVerdict: B") == "B"
    assert read_verdict("**Verdict:** tie") == "tie"
    assert read_verdict("A") == "A" and read_verdict("I cannot tell") is None


def test_chat_judge_posts_the_rubric_to_the_chat_route(monkeypatch):
    sent = {}

    def fake_post(url, body, timeout):
        sent.update(url=url, body=body)
        return {"choices": [{"message": {"content": "Verdict: B"}}]}

    monkeypatch.setattr("sglang_specsot.bench.chat_judge.post_json", fake_post)
    judge = ChatJudge("http://h:1/v1", "big-judge", max_tokens=300)
    assert judge("Q?", "first answer", "second answer") == "B"
    assert sent["url"] == "http://h:1/v1/chat/completions" and sent["body"]["model"] == "big-judge"
    prompt = sent["body"]["messages"][0]["content"]
    assert "keeps the premise" in prompt.lower() and prompt.index("first answer") < prompt.index("second answer")
    assert chat_route("http://h:1/") == "http://h:1/v1/chat/completions"


def test_run_controls_writes_a_record_the_report_reads(tmp_path):
    from sglang_specsot.bench.judge_controls import load_controls
    from sglang_specsot.bench.judge_run import run_controls

    record = run_controls(always_a, "always-A", NORMALS, [(1, "SoT-server", "q", "sot", "normal")], tmp_path)
    assert record["passes"] is False and record["score"]["askings"] == 18
    name, result = load_controls(tmp_path)
    assert name == "always-A" and result.preferred_real == 9 and result.real_pairs == 1
    assert json.loads((tmp_path / "judge_controls.json").read_text())["real"][0]["sot_first"] == "A"
    looping = jc.NormalAnswer(7, "How do I save money?", LOOPING)
    record = run_controls(always_a, "always-A", [*NORMALS, looping], [], tmp_path)
    assert record["sound_answers"] == 3 and record["excluded"] == {"7": jc.LOOPED}


def test_the_report_line_beside_the_verdicts_says_whether_they_count(tmp_path):
    from sglang_specsot.bench.e2e import _judge_line
    from sglang_specsot.bench.judge_run import run_controls

    assert _judge_line(tmp_path) == ""  # nothing judged, nothing to say
    (tmp_path / "judge.jsonl").write_text("{}\n")
    assert "no controls run" in _judge_line(tmp_path)
    run_controls(reads_content, "reader", NORMALS, [(1, "SoT-server", NORMALS[0].question, SLEEP, TIPS)], tmp_path)
    assert _judge_line(tmp_path).startswith("Judge reader: prefers the real answer in 18/18") and "passes" in _judge_line(tmp_path)


def test_a_stopped_run_keeps_every_asking_it_finished(tmp_path):
    from sglang_specsot.bench.judge_run import run_controls

    asked = []

    def stops_after_three(question, a, b):
        if len(asked) == 3:
            raise KeyboardInterrupt
        asked.append(a)
        return "A"

    try:
        run_controls(stops_after_three, "stopped", NORMALS, [], tmp_path)
    except KeyboardInterrupt:
        pass
    record = json.loads((tmp_path / "judge_controls.json").read_text())
    assert record["score"]["askings"] == 3 and len(record["controls"]) == 3


def test_recorded_real_pairs_come_from_judge_jsonl_without_identical_answers(tmp_path):
    from sglang_specsot.bench.judge_run import recorded_real_pairs, run_controls
    from tests.unit.bench.conftest import cell

    cells = [cell(1, "plain", answer="x"), cell(1, "SoT-server", answer="y"),
             cell(2, "plain", answer="same"), cell(2, "SoT-server", answer="same")]  # fmt: skip
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(dataclasses.asdict(c)) + "\n" for c in cells))
    rows = [{"question_id": 1, "config": "SoT-server", "sot_first": "A", "normal_first": "A"},
            {"question_id": 2, "config": "SoT-server", "sot_first": "tie", "normal_first": "tie"}]  # fmt: skip
    (tmp_path / "judge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert recorded_real_pairs(tmp_path, ["SoT-server"]) == [(1, "SoT-server", "A", "A")]
    record = run_controls(always_a, "recorded", [], [], tmp_path, recorded=recorded_real_pairs(tmp_path, ["SoT-server"]))
    assert record["score"] == {"askings": 0, "preferred_real": 0, "real_pairs": 1, "consistent": 0}


def test_judging_by_url_runs_the_controls_then_records_the_real_pairs(tmp_path):
    from sglang_specsot.bench.judge import load_judgements
    from sglang_specsot.bench.judge_controls import load_controls
    from sglang_specsot.bench.judge_run import judge_by_url
    from sglang_specsot.data import load_questions
    from tests.unit.bench.conftest import cell

    rows = load_questions("sglang_specsot/data/router_holdout.jsonl")[:3]
    ids = [int(r.get("id", i)) for i, r in enumerate(rows, 1)]
    normals = dict(zip(ids, (TIPS, FASHION, SLEEP)))
    cells = [cell(q, "plain", answer=normals[q]) for q in ids]
    cells += [cell(ids[0], "SoT-server", answer=SLEEP), cell(ids[1], "SoT-server", answer=FASHION)]  # the second: identical
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(dataclasses.asdict(c)) + "\n" for c in cells))
    (tmp_path / "run.json").write_text(json.dumps({"questions": "sglang_specsot/data/router_holdout.jsonl"}))
    line = judge_by_url(tmp_path, always_a, "always-A", ["SoT-server"])
    assert "FAILS" in line and load_controls(tmp_path)[1].askings == 18
    assert load_judgements(tmp_path) == {"SoT-server": {ids[0]: "tie", ids[1]: "tie"}}  # A, A: the orders disagree
    judge_by_url(tmp_path, always_a, "always-A", ["SoT-server"])  # again: nothing new to record
    assert load_controls(tmp_path)[1].real_pairs == 1  # the record still holds the real pair
    assert len((tmp_path / "judge.jsonl").read_text().splitlines()) == 2
