from __future__ import annotations

import dataclasses
import json
import re

import pytest

from sglang_specsot.bench import blind
from sglang_specsot.bench import judge_controls as jc
from tests.unit.bench.test_judge_controls import (
    FASHION,
    LOOPING,
    NORMALS,
    SLEEP,
    TIPS,
    always_a,
    reads_content,
)

_ITEM = re.compile(
    r"=== (item-\d+) ===\nQUESTION: (.*?)\n\n--- ANSWER A ---\n(.*?)\n\n--- ANSWER B ---\n(.*?)\n(?=\n===|\Z)",
    re.S,
)


@pytest.fixture
def run_dir(tmp_path):
    """A run of four suitable questions: three sound normal answers and one that loops; two SoT
    answers that differ from the normal ones and one that is the same."""
    from tests.unit.bench.conftest import cell

    ids = [1, 2, 3, 7]
    questions = [n.question for n in NORMALS] + ["How do I save money?"]
    cells = [
        cell(q, "plain", answer=a) for q, a in zip(ids, (TIPS, FASHION, SLEEP, LOOPING))
    ]
    cells += [cell(ids[0], "SoT-server", answer=SLEEP), cell(ids[1], "SoT-server", answer=FASHION),
              cell(ids[3], "SoT-server", answer=TIPS)]  # fmt: skip
    out = tmp_path / "run"
    out.mkdir()
    (out / "cells.jsonl").write_text(
        "".join(json.dumps(dataclasses.asdict(c)) + "\n" for c in cells)
    )
    rows = [{"id": q, "question": text} for q, text in zip(ids, questions)]
    (out / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "run.json").write_text(
        json.dumps({"questions": str(out / "questions.jsonl")})
    )
    return out, ids


def read_packets(folder):
    """{item: (question, answer A, answer B)} of every packet, and {item: packet}."""
    items, where = {}, {}
    for path in sorted(folder.glob("packet-*.txt")):
        text = path.read_text()
        found = _ITEM.findall(text)
        assert len(found) == text.count("=== item-"), (
            f"{path} holds something besides items"
        )
        for item, question, a, b in found:
            items[item], where[item] = (question, a, b), int(path.stem.split("-")[1])
    return items, where


def answer_packets(folder, judge) -> None:
    """A reader that sees only the packets: verdicts-N.jsonl for each packet-N.txt."""
    items, where = read_packets(folder)
    for item, (question, a, b) in items.items():
        with (folder / f"verdicts-{where[item]}.jsonl").open("a") as f:
            f.write(json.dumps({"item": item, "verdict": judge(question, a, b)}) + "\n")


def test_packets_hold_only_questions_and_answers_with_each_pairs_orders_apart(
    run_dir, tmp_path
):
    out, ids = run_dir
    keys = blind.write_packets(out, ["SoT-server"], tmp_path / "p", readers=3, seed=5)
    assert keys["sound_answers"] == 3 and keys["excluded"] == {str(ids[3]): jc.LOOPED}
    assert keys["identical"] == [[ids[1], "SoT-server"]]
    kinds = [a["kind"] for a in keys["askings"]]
    assert (
        kinds.count(blind.REAL) == 4
        and len(kinds) - kinds.count(blind.REAL) == 3 * 3 * 2
    )
    items, where = read_packets(tmp_path / "p")
    assert (
        sorted(items)
        == [a["item"] for a in keys["askings"]]
        == [f"item-{i:03d}" for i in range(22)]
    )
    packets = " ".join(
        (tmp_path / "p" / f"packet-{i}.txt").read_text() for i in range(3)
    )
    for hint in ("SoT", "plain", "control", "repeated", "scrambled", "real", "config"):
        assert hint not in packets
    pairs: dict = {}
    for a in map(lambda a: blind.Asking(**a), keys["askings"]):
        assert where[a.item] == a.packet
        pairs.setdefault(a.pair, set()).add(a.packet)
    assert all(
        len(p) == 2 for p in pairs.values()
    )  # the two orders of a pair: two readers
    assert [p["items"] for p in keys["packets"]] == [8, 7, 7]
    assert (
        "keeps the premise" in (tmp_path / "p" / blind.RUBRIC_FILE).read_text().lower()
    )


def test_the_seed_fixes_the_packets(run_dir, tmp_path):
    out, _ = run_dir
    texts = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        blind.write_packets(out, ["SoT-server"], tmp_path / name, readers=2, seed=seed)
        texts.append((tmp_path / name / "packet-0.txt").read_text())
    assert texts[0] == texts[1] != texts[2]
    with pytest.raises(ValueError, match="different readers"):
        blind.write_packets(out, ["SoT-server"], tmp_path / "d", readers=1)


def test_scored_verdicts_become_the_runs_controls_and_judge_verdicts(run_dir, tmp_path):
    from sglang_specsot.bench.judge import load_judgements

    out, ids = run_dir
    (out / "judge.jsonl").write_text(
        json.dumps({"question_id": ids[0], "config": "SoT-server", "verdict": "win"})
        + "\n"
    )
    folder = tmp_path / "p"
    blind.write_packets(out, ["SoT-server"], folder, readers=4)
    answer_packets(folder, reads_content)
    record = blind.score_verdicts(out, folder, "a reader, blind")
    assert (
        record["passes"]
        and record["unjudged"] == 0
        and record["by_kind"] == {k: (6, 6) for k in jc.KINDS}
    )
    assert jc.load_controls(out)[0] == "a reader, blind"
    assert (
        record["excluded"] == {str(ids[3]): jc.LOOPED} and record["sound_answers"] == 3
    )
    # The previous judge's verdicts are kept aside; the run's verdicts are now the reader's.
    assert "win" in (out / blind.PREVIOUS_JUDGE_FILE).read_text()
    rows = [json.loads(line) for line in (out / "judge.jsonl").read_text().splitlines()]
    assert {r["judge"] for r in rows} == {"a reader, blind"} and len(rows) == 3
    verdicts = load_judgements(out)["SoT-server"]
    assert verdicts[ids[1]] == "tie"  # identical answers: a tie, never asked
    assert verdicts == {
        ids[0]: "loss",
        ids[1]: "tie",
        ids[3]: "loss",
    }  # off-topic SoT answers lose in both orders
    blind.score_verdicts(
        out, folder, "a reader, blind"
    )  # again: the same judge's file is replaced
    assert len((out / "judge.jsonl").read_text().splitlines()) == 3


def test_missing_and_malformed_verdicts(run_dir, tmp_path):
    out, _ = run_dir
    folder = tmp_path / "p"
    keys = blind.write_packets(out, ["SoT-server"], folder, readers=2)
    first = keys["askings"][0]["item"]
    (folder / "verdicts-0.jsonl").write_text(
        json.dumps({"id": first, "verdict": always_a("", "", "")}) + "\n"
    )
    assert (
        blind.score_verdicts(out, folder, "partial")["unjudged"]
        == len(keys["askings"]) - 1
    )
    (folder / "verdicts-1.jsonl").write_text('{"item": "item-999", "verdict": "A"}\n')
    with pytest.raises(ValueError, match="verdicts-1.jsonl:1"):
        blind.score_verdicts(out, folder, "bad")


def test_the_commands(run_dir, tmp_path, capsys):
    from sglang_specsot.bench.__main__ import main

    out, _ = run_dir
    folder = tmp_path / "p"
    assert (
        main(
            [
                "blind-packets",
                str(out),
                "--configs",
                "SoT-server",
                "--out",
                str(folder),
                "--readers",
                "2",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert (
        "Controls built from 3 of 4 normal answers" in printed
        and "18 control askings, 4 real-pair askings" in printed
    )
    answer_packets(folder, always_a)
    assert main(["blind-score", str(out), str(folder), "--judge-name", "always A"]) == 0
    assert "Judge always A: prefers the real answer in 9/18" in capsys.readouterr().out
