"""Blind verdicts from readers outside the benchmark (LLM readers or people), in two steps.

`blind-packets` collects every asking of a run: the judge's controls (built from the sound
normal answers, bench/judge_controls.py) and the real (SoT, normal) pairs whose answers differ,
each in both orders. The askings are shuffled with a fixed seed, numbered item-000, item-001,
... and dealt into packets, one per reader, so that the two orders of one pair go to different
readers. A packet holds only each item's question, answer A and answer B: no configuration, no
hint which answer is a control or SoT's. `rubric.md` beside the packets says how to judge and
how to reply; keys.json (which asking each item is) stays with whoever scores, not the readers.

`blind-score` reads the readers' verdicts-*.jsonl ({"item": "item-007", "verdict": "A"}) back
through the keys: the control score goes to RUN_DIR/judge_controls.json (as `judge-controls`
writes it) and the real pairs' verdicts, with the judge's name, become the run's judge.jsonl,
the verdicts the report counts as W/T/L beside that control score.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_specsot.bench import judge_controls as jc
from sglang_specsot.bench.chat_judge import RUBRIC
from sglang_specsot.bench.judge import JUDGE_FILE, Judgement, pending
from sglang_specsot.bench.judge_run import (
    normal_answers,
    real_pairs,
    write_controls_record,
)
from sglang_specsot.bench.metrics import combine_verdicts
from sglang_specsot.bench.store import CELLS_FILE, load

KEYS_FILE, RUBRIC_FILE = "keys.json", "rubric.md"
PREVIOUS_JUDGE_FILE = (
    "judge.previous.jsonl"  # where another judge's judge.jsonl is moved
)
REAL = "real"  # an asking's kind when it is a real (SoT, normal) pair, not a control
WORDS = ("A", "B", "tie")
INSTRUCTIONS = """# Judging the packets

Each packet-N.txt holds items. An item is a question and two answers to it, Answer A and
Answer B. Read each item on its own and decide which answer is better.

{rubric}

Reply for packet-N.txt in verdicts-N.jsonl, one JSON line per item of the packet:

    {{"item": "item-007", "verdict": "A"}}

with "A", "B" or "tie" as the verdict. Judge every item, and only from its text.
"""


@dataclass(frozen=True, slots=True)
class Asking:
    """One pair in one order, as the keys file records it (the texts stay in the packet)."""

    item: str  # "item-007", the only name a reader sees
    packet: int
    question_id: int
    kind: str  # a control kind (jc.KINDS), or REAL
    config: str  # the SoT configuration of a real pair ("" for a control)
    first: bool  # shown as A: the real answer (control) or the SoT answer (real pair)

    @property
    def pair(self) -> tuple[int, str, str]:
        """What the two orders of one pair share."""
        return (self.question_id, self.kind, self.config)


def _askings(
    out: Path, configs: list[str], seed: int
) -> tuple[list[tuple[tuple, str, str, str]], dict]:
    """((question_id, kind, config, first), question, answer A, answer B) of every asking, and
    what keys.json records beside them."""
    normals = normal_answers(out)
    sound, excluded = jc.sound_answers(normals)
    found = []
    for pair in jc.control_pairs(normals, seed):
        for first in (True, False):
            a, b = (pair.real, pair.control) if first else (pair.control, pair.real)
            found.append(
                ((pair.question_id, pair.kind, "", first), pair.question, a, b)
            )
    for qid, config, question, sot, normal in real_pairs(out, configs):
        for first in (True, False):
            a, b = (sot, normal) if first else (normal, sot)
            found.append(((qid, REAL, config, first), question, a, b))
    identical = [[c.question_id, c.config] for c, base in pending(load(out / CELLS_FILE), configs, {})
                 if c.answer == base.answer]  # fmt: skip
    meta = {"run": str(out), "configs": configs, "seed": seed, "sound_answers": len(sound),
            "excluded": {str(q): why for q, why in sorted(excluded.items())}, "identical": identical}  # fmt: skip
    return found, meta


def deal(pairs: list[tuple[int, str, str]], readers: int) -> list[int]:
    """A packet for each asking (in order; `pairs[i]` is what its pair shares): the emptiest
    packet that does not already hold the other order of its pair."""
    if readers < 2:
        raise ValueError(
            f"--readers {readers}: the two orders of a pair must go to different readers; give 2 or more"
        )
    sizes, holds, packets = [0] * readers, [set() for _ in range(readers)], []
    for pair in pairs:
        packet = min(
            (p for p in range(readers) if pair not in holds[p]),
            key=lambda p: (sizes[p], p),
        )
        sizes[packet] += 1
        holds[packet].add(pair)
        packets.append(packet)
    return packets


def item_text(item: str, question: str, a: str, b: str) -> str:
    return f"=== {item} ===\nQUESTION: {question}\n\n--- ANSWER A ---\n{a}\n\n--- ANSWER B ---\n{b}\n"


def write_packets(
    out: Path, configs: list[str], dest: Path, readers: int = 4, seed: int = 0
) -> dict:
    """Packets, rubric.md and keys.json for `out`'s askings in `dest`; returns keys.json's
    content with each packet's item count and size in characters."""
    found, meta = _askings(out, configs, seed)
    random.Random(seed).shuffle(found)
    packets = deal(
        [(qid, kind, config) for (qid, kind, config, _), *_ in found], readers
    )
    width = max(3, len(str(len(found) - 1)))
    askings = [
        Asking(f"item-{i:0{width}d}", packet, *key)
        for i, ((key, *_), packet) in enumerate(zip(found, packets))
    ]
    texts: list[list[str]] = [[] for _ in range(readers)]
    for asking, (_, question, a, b) in zip(askings, found):
        texts[asking.packet].append(item_text(asking.item, question, a, b))
    dest.mkdir(parents=True, exist_ok=True)
    for packet, items in enumerate(texts):
        (dest / f"packet-{packet}.txt").write_text("\n".join(items))
    (dest / RUBRIC_FILE).write_text(INSTRUCTIONS.format(rubric=RUBRIC))
    sizes = [{"items": len(items), "chars": len("\n".join(items))} for items in texts]
    keys = dict(
        meta, readers=readers, packets=sizes, askings=[asdict(a) for a in askings]
    )
    (dest / KEYS_FILE).write_text(json.dumps(keys, indent=1) + "\n")
    return keys


def read_verdicts(folder: Path, items: set[str]) -> dict[str, str]:
    """{item: "A" | "B" | "tie"} from every verdicts-*.jsonl in `folder` (the key "id" is read
    as "item", as the first blind reading wrote it)."""
    found: dict[str, str] = {}
    for path in sorted(folder.glob("verdicts-*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            item, word = row.get("item", row.get("id")), row.get("verdict")
            if item not in items or word not in WORDS:
                raise ValueError(f"{path}:{n}: {line.strip()!r} is not a verdict on a known item; "
                                 f'write {{"item": "item-007", "verdict": "A"}} with A, B or tie')  # fmt: skip
            found[item] = word
    return found


def score_verdicts(
    out: Path, folder: Path, judge_name: str, dest: Path | None = None
) -> dict:
    """The readers' verdicts in `folder`, scored through its keys.json: dest/judge_controls.json
    and dest/judge.jsonl (dest: the run directory). Returns the control record, with the number
    of items nobody judged."""
    dest = dest or out
    keys = json.loads((folder / KEYS_FILE).read_text())
    askings = [Asking(**a) for a in keys["askings"]]
    words = read_verdicts(folder, {a.item for a in askings})
    controls = [
        jc.ControlVerdict(a.question_id, a.kind, a.first, words.get(a.item))
        for a in askings
        if a.kind != REAL
    ]
    orders: dict[tuple[int, str], dict[bool, str | None]] = {}
    for a in askings:
        if a.kind == REAL:
            orders.setdefault((a.question_id, a.config), {})[a.first] = words.get(
                a.item
            )
    real = [
        (qid, config, o.get(True), o.get(False))
        for (qid, config), o in sorted(orders.items())
    ]
    excluded = {int(q): why for q, why in keys["excluded"].items()}
    record = write_controls_record(
        judge_name, keys["seed"], controls, real, dest, keys["sound_answers"], excluded
    )
    identical = [(qid, config, "tie", "tie") for qid, config in keys["identical"]]
    write_judgements(dest, judge_name, sorted(real + identical))
    return dict(record, unjudged=len(askings) - len(words))


def write_judgements(
    dest: Path, judge_name: str, real: list[tuple[int, str, str | None, str | None]]
) -> None:
    """dest/judge.jsonl from (question_id, config, SoT-first word, normal-first word), each row
    naming its judge; another judge's judge.jsonl is first moved to judge.previous.jsonl."""
    path = dest / JUDGE_FILE
    if path.exists() and _other_judge(path, judge_name):
        previous = dest / PREVIOUS_JUDGE_FILE
        if previous.exists():
            raise ValueError(
                f"{path} holds another judge's verdicts and {previous} exists; move one of them aside"
            )
        path.rename(previous)
    rows = [
        dict(asdict(Judgement(q, c, a, b, combine_verdicts(a, b))), judge=judge_name)
        for q, c, a, b in real
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _other_judge(path: Path, judge_name: str) -> bool:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return any(row.get("judge") != judge_name for row in rows)


def packets_cli(args) -> str:
    """`blind-packets`: the packets of a run, and a summary of what they hold."""
    out, dest = Path(args.out), Path(args.dest)
    keys = write_packets(out, args.configs.split(","), dest, args.readers, args.seed)
    kinds = [a["kind"] for a in keys["askings"]]
    excluded = {int(q): why for q, why in keys["excluded"].items()}
    sizes = ", ".join(
        f"packet-{i}.txt {p['items']} items {p['chars']:,} chars"
        for i, p in enumerate(keys["packets"])
    )
    return "\n".join([
        jc.describe_sound(keys["sound_answers"], excluded),
        f"{len(kinds) - kinds.count(REAL)} control askings, {kinds.count(REAL)} real-pair askings "
        f"({len(keys['identical'])} pairs with identical answers not asked); {sizes}",
        f"Give each reader one packet and {dest / RUBRIC_FILE}, never {dest / KEYS_FILE}; "
        f"their replies go to {dest}/verdicts-N.jsonl.",
    ])  # fmt: skip


def score_cli(args) -> str:
    """`blind-score`: the readers' verdicts scored into the run; returns the judge's line."""
    out = Path(args.out)
    record = score_verdicts(
        out, Path(args.folder), args.judge_name, Path(args.dest) if args.dest else None
    )
    unjudged = (
        f"{record['unjudged']} items without a verdict (counted as no answer)\n"
        if record["unjudged"]
        else ""
    )
    return f"{unjudged}{record['line']}"
