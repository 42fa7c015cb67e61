"""The replay stage's inputs and plans (scripts/gpu_stage_replay.py), plain Python: a trace
folder's answer shapes, the requests that answer them at exactly the recorded lengths, the
accept lengths the trace promises, and the medians and ratios of what was measured.

A trace folder (`benchmarks/traces-*`) holds `trace.jsonl` (speculative/trace.py's TraceStep
lines, as SGLANG_SPECSOT_TRACE wrote them on the SPECSOT server) and `answers.jsonl`, one
object per question:

    {"question_id", "plain_tokens", "plain_prompt_tokens", "specsot_rid" (or null),
     "skeleton_tokens", "skeleton_prompt_tokens", "skeleton_rid" (null: no SoT answer),
     "branch_tokens": [..], "branch_rids": [..] ("": a branch traced under no rid),
     "branch_prefix_tokens", "branch_suffix_tokens" (one for all branches, or one each)}

as sglang_specsot/bench/trace_shapes.py writes it. Every request of a pass carries the rid
`<recorded rid>@<pass tag>` (speculative/replay.py's REPEAT_SEP), so a SPECSOT replay server
replays the recorded request again on every pass (an untraced branch: nothing, plain decoding).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_specsot.speculative.replay import REPEAT_SEP
from sglang_specsot.speculative.trace import TraceStep, read_trace

TRACES_GLOB = "traces-*"  # under benchmarks/
# Random prompt ids start past the special ids (0-2) of the Qwen2 configs here.
FIRST_PROMPT_ID = 3


@dataclass(frozen=True)
class AnswerShape:
    """One question's recorded answers: the normal answer and the SoT answer, in tokens."""

    question_id: str
    plain_tokens: int
    plain_prompt_tokens: int
    # The traced normal answer's rid on the SPECSOT server; None: not traced.
    specsot_rid: str | None
    skeleton_tokens: int
    skeleton_prompt_tokens: int
    skeleton_rid: str | None  # None: the question has no SoT answer (and no branches)
    branch_tokens: tuple[int, ...]
    # One per branch, in the order of branch_tokens; "": that branch was traced under no rid.
    branch_rids: tuple[str, ...]
    branch_prefix_tokens: int  # the prompt prefix all branches share
    # Each branch's own prompt tokens after the prefix.
    branch_suffix_tokens: tuple[int, ...]

    @property
    def branches(self) -> int:
        return len(self.branch_tokens)

    @property
    def complete(self) -> bool:
        """Both answers traced: the normal one and a SoT one with its branches."""
        return (
            self.specsot_rid is not None
            and self.skeleton_rid is not None
            and self.branches > 0
        )


@dataclass(frozen=True)
class TraceFolder:
    """A trace folder, loaded: its answers in file order and the trace's steps by recorded rid."""

    path: Path
    answers: tuple[AnswerShape, ...]
    trace: dict[str, list[TraceStep]]

    @property
    def trace_file(self) -> Path:
        return self.path / "trace.jsonl"


@dataclass(frozen=True)
class Request:
    """One generate call's request: exactly `max_new_tokens` new tokens (ignore_eos)."""

    rid: str
    input_ids: tuple[int, ...]
    max_new_tokens: int

    def params(self) -> dict:
        return {
            "temperature": 0.0,
            "max_new_tokens": self.max_new_tokens,
            "ignore_eos": True,
        }


@dataclass(frozen=True)
class Limits:
    """What requests may hold: prompt ids below `vocab`; on the CPU smoke, lengths capped."""

    vocab: int
    # A cap on every request's new tokens (None: the recorded length).
    max_new: int | None = None
    max_prompt: int | None = None  # cap on every prompt's length

    def new(self, n: int) -> int:
        return max(1, n if self.max_new is None else min(n, self.max_new))

    def prompt(self, n: int) -> int:
        return max(1, n if self.max_prompt is None else min(n, self.max_prompt))

    def capped(self, max_new: int | None) -> Limits:
        """These limits with new tokens cut to `max_new` too (None: unchanged)."""
        if max_new is None:
            return self
        return replace(
            self,
            max_new=max_new if self.max_new is None else min(self.max_new, max_new),
        )


# --- loading ---------------------------------------------------------------------------------

_INT_FIELDS = (
    "plain_tokens",
    "plain_prompt_tokens",
    "skeleton_tokens",
    "skeleton_prompt_tokens",
    "branch_prefix_tokens",
)


def newest_trace_folder(benchmarks: Path) -> Path:
    """The `traces-*` folder under `benchmarks` whose answers.jsonl was written last (ties: the
    last by name)."""
    folders = [
        p for p in benchmarks.glob(TRACES_GLOB) if (p / "answers.jsonl").is_file()
    ]
    if not folders:
        raise ValueError(f"no {TRACES_GLOB} folder with an answers.jsonl under {benchmarks}; pass --traces DIR "
                         "(or SPECSOT_GPU_TRACES) naming a folder of trace.jsonl and answers.jsonl")  # fmt: skip
    return max(folders, key=lambda p: ((p / "answers.jsonl").stat().st_mtime, p.name))


def load_trace_folder(path: Path) -> TraceFolder:
    """The folder's answers and trace; ValueError naming the file, the line and the fix where
    either is missing or malformed, or an answer names a rid the trace lacks."""
    for name in ("trace.jsonl", "answers.jsonl"):
        if not (path / name).is_file():
            raise ValueError(
                f"{path} has no {name}: a trace folder holds trace.jsonl and answers.jsonl"
            )
    try:
        trace = read_trace(str(path / "trace.jsonl"))
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise ValueError(
            f"{path / 'trace.jsonl'} is not a trace of TraceStep lines: {exc!r}"
        ) from exc
    answers = tuple(_answers(path / "answers.jsonl"))
    if not answers:
        raise ValueError(f"{path / 'answers.jsonl'} has no answers")
    for answer in answers:
        missing = [r for r in _rids(answer) if r not in trace]
        if missing:
            raise ValueError(f"{path}: question {answer.question_id!r} names rids {missing} that trace.jsonl does not "
                             "have; record answers.jsonl and trace.jsonl in the same run")  # fmt: skip
    return TraceFolder(path, answers, trace)


def _answers(path: Path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield parse_answer(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: {exc}") from exc


def parse_answer(d: dict) -> AnswerShape:
    """One answers.jsonl object; ValueError naming the field that is missing or wrong."""
    missing = [k for k in (*_INT_FIELDS, "question_id", "skeleton_rid", "branch_tokens", "branch_rids",
                           "branch_suffix_tokens") if k not in d]  # fmt: skip
    if missing:
        raise ValueError(f"missing fields {missing}")
    ints = {k: _count(d, k) for k in _INT_FIELDS}
    branch_tokens = tuple(
        _count({"branch_tokens": t}, "branch_tokens") for t in d["branch_tokens"]
    )
    branch_rids = tuple("" if r is None else str(r) for r in d["branch_rids"])
    if len(branch_rids) != len(branch_tokens):
        raise ValueError(
            f"{len(branch_tokens)} branch_tokens and {len(branch_rids)} branch_rids: one of each per branch"
        )
    suffix = d["branch_suffix_tokens"]
    suffixes = (
        tuple(suffix) if isinstance(suffix, list) else (suffix,) * len(branch_tokens)
    )
    if len(suffixes) != len(branch_tokens):
        raise ValueError(
            f"{len(suffixes)} branch_suffix_tokens for {len(branch_tokens)} branches"
        )
    specsot_rid, skeleton_rid = d.get("specsot_rid"), d["skeleton_rid"]
    return AnswerShape(
        question_id=str(d["question_id"]), specsot_rid=None if specsot_rid is None else str(specsot_rid),
        skeleton_rid=None if skeleton_rid is None else str(skeleton_rid), branch_tokens=branch_tokens, branch_rids=branch_rids,
        branch_suffix_tokens=tuple(_count({"branch_suffix_tokens": s}, "branch_suffix_tokens") for s in suffixes),
        **ints,
    )  # fmt: skip


def _count(d: dict, key: str) -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a count (an int >= 0), got {value!r}")
    return value


def _rids(answer: AnswerShape) -> list[str]:
    return [
        r for r in (answer.specsot_rid, answer.skeleton_rid, *answer.branch_rids) if r
    ]


# --- what is measured ------------------------------------------------------------------------


def measured_answers(answers: Sequence[AnswerShape], count: int) -> list[AnswerShape]:
    """`count` answers to time, cycling the complete questions (both answers traced) in order:
    every configuration answers the same questions."""
    complete = [a for a in answers if a.complete]
    if not complete:
        raise ValueError(
            "no question has both a traced normal answer (specsot_rid) and a SoT answer (skeleton_rid, branches)"
        )
    return [complete[i % len(complete)] for i in range(count)]


def warmup_answers(answers: Sequence[AnswerShape]) -> list[AnswerShape]:
    """The warm-up pass: the first traced answer of each branch count, so every batch size the
    timed passes meet has compiled and captured before any timing."""
    firsts: dict[int, AnswerShape] = {}
    for answer in answers:
        if answer.complete:
            firsts.setdefault(answer.branches, answer)
    return list(firsts.values())


def random_ids(seed: str, n: int, vocab: int) -> tuple[int, ...]:
    """`n` prompt ids in [FIRST_PROMPT_ID, vocab), the same for the same seed on every run."""
    rng = random.Random(seed)
    return tuple(rng.randrange(FIRST_PROMPT_ID, vocab) for _ in range(n))


def tagged(rid: str, tag: str) -> str:
    """The rid of recorded request `rid` in the pass `tag` (the replay's REPEAT_SEP)."""
    return f"{rid}{REPEAT_SEP}{tag}"


def normal_request(answer: AnswerShape, tag: str, limits: Limits) -> Request:
    """The normal answer: a random prompt of plain_prompt_tokens, exactly plain_tokens new."""
    assert answer.specsot_rid is not None, (
        f"question {answer.question_id} has no traced normal answer"
    )
    return _single(
        answer,
        "plain",
        answer.specsot_rid,
        answer.plain_prompt_tokens,
        answer.plain_tokens,
        tag,
        limits,
    )


def skeleton_request(answer: AnswerShape, tag: str, limits: Limits) -> Request:
    """The skeleton: a random prompt of skeleton_prompt_tokens, exactly skeleton_tokens new."""
    assert answer.skeleton_rid is not None, (
        f"question {answer.question_id} has no SoT answer"
    )
    return _single(answer, "skeleton", answer.skeleton_rid, answer.skeleton_prompt_tokens, answer.skeleton_tokens,
                   tag, limits)  # fmt: skip


def _single(answer: AnswerShape, part: str, rid: str, prompt_tokens: int, new_tokens: int, tag: str,
            limits: Limits) -> Request:  # fmt: skip
    """One recorded generation in pass `tag`: its prompt seeded by question and part, the same
    on every pass."""
    prompt = random_ids(
        f"{answer.question_id}/{part}", limits.prompt(prompt_tokens), limits.vocab
    )
    return Request(tagged(rid, tag), prompt, limits.new(new_tokens))


def branch_requests(
    answer: AnswerShape, tag: str, limits: Limits, skeleton: Sequence[int]
) -> list[Request]:
    """The branches, sent together: a shared prefix of branch_prefix_tokens (the skeleton's
    prompt and output as far as they reach, which the radix cache holds, then random ids),
    then each branch's own random suffix."""
    n = limits.prompt(answer.branch_prefix_tokens)
    filler = random_ids(
        f"{answer.question_id}/prefix", max(0, n - len(skeleton)), limits.vocab
    )
    prefix = (tuple(skeleton) + filler)[:n]
    out = []
    for i, (rid, tokens, suffix) in enumerate(
        zip(answer.branch_rids, answer.branch_tokens, answer.branch_suffix_tokens)
    ):
        own = random_ids(
            f"{answer.question_id}/branch{i}", limits.prompt(suffix), limits.vocab
        )
        rid = (
            rid or f"untraced-{answer.question_id}-branch{i}"
        )  # replays nothing: plain decoding
        out.append(Request(tagged(rid, tag), prefix + own, limits.new(tokens)))
    return out


# --- what the trace promises -----------------------------------------------------------------


def served_accept_length(steps: Sequence[TraceStep], max_new: int) -> float:
    """SGLang's spec_accept_length (completion tokens / verify steps) for a request replaying
    `steps` to exactly `max_new` tokens: prefill gives one token, each step its accepted + 1,
    plain steps of one token once the recorded steps run out."""
    tokens, verifies = 1, 0
    for step in steps:
        if tokens >= max_new:
            break
        tokens, verifies = tokens + step.accepted + 1, verifies + 1
    verifies += max(0, max_new - tokens)  # past the recorded steps: one token a step
    return max_new / verifies if verifies else 1.0


def mean_accept_length(trace: dict[str, list[TraceStep]], rids: Sequence[str]) -> float:
    """1 + the mean accepted drafts over every step of `rids`: the accept length
    SGLANG_SIMULATE_ACC_LEN takes (spec_utils.py `sample_simulated_acc_len`, match-expected)."""
    steps = [s for rid in rids for s in trace[rid]]
    if not steps:
        raise ValueError(f"the trace has no steps for {list(rids)}")
    return 1 + sum(s.accepted for s in steps) / len(steps)


def standalone_steps(accept_length: float, floor: int = 3) -> int:
    """STANDALONE's chain depth: SGLang's usual 3 (topk 1), deeper where the simulated accept
    length needs it (it is capped at depth + 1)."""
    return max(floor, math.ceil(accept_length) - 1)


def tree_window(trace: dict[str, list[TraceStep]]) -> tuple[int, int]:
    """(verify window, draft depth) a SPECSOT server needs to replay every recorded tree."""
    steps = [s for recorded in trace.values() for s in recorded]
    width = max((len(s.parents) for s in steps), default=1)
    depth = max((s.padded(len(s.parents)).height for s in steps), default=0)
    return max(width, 2), max(depth, 1)


# --- the report ------------------------------------------------------------------------------


def summary(latencies: dict[str, list[float]], plain: str = "plain", sot: str = "SoT-only",
            specsot: str = "SpecSoT") -> dict:  # fmt: skip
    """Per configuration the median seconds per answer, the answers timed and the speed-up over
    `plain` (its median over theirs), and SpecSoT's over SoT-only."""
    medians = {name: statistics.median(v) for name, v in latencies.items() if v}
    out = {name: {"median_s": round(m, 4), "answers": len(latencies[name]),
                  "speed_vs_plain": _ratio(medians.get(plain), m)} for name, m in medians.items()}  # fmt: skip
    return {
        "configs": out,
        "specsot_vs_sot": _ratio(medians.get(sot), medians.get(specsot)),
    }


def _ratio(base: float | None, other: float | None) -> float | None:
    return None if base is None or not other else round(base / other, 3)
