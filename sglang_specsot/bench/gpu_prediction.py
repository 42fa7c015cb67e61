"""A GPU latency prediction from a roofline: what plain, SoT-only, SPECSOT-only and SpecSoT
would take end to end on a GPU nobody here has measured, and every assumption it rests on.

Greedy acceptance and answer shapes are properties of the models and the text, not of the
hardware, so they come from real runs (the step logs' acceptance by depth; the SoT answers'
skeleton, points and branch lengths). Only the time of a forward is modelled:

    forward_ms(rows) = max(bytes read / HBM bandwidth, 2 * params * rows / bf16 FLOP rate)
                       + a fixed per-forward overhead (launch, sampling, scheduler)

bytes read = the bf16 weights the matrix products touch (the LM head included; an untied
input embedding is a gather, not a read) + the KV cache of `context` tokens per row. The same
`ForwardCost`/`CostModel` the runtime keeps then prices every step, and `speedup_ceiling`
picks SPECSOT's draft budget, so the prediction is the ceiling tooling's on GPU costs.

Assumptions (each one stated where the docs show the table):
- one request on an idle GPU: no queueing, no other request's rows in any forward;
- every decode step replays a CUDA graph, so its host cost is the fixed overhead alone;
- the published peak bandwidth and FLOP rate are reached (real kernels reach 70-90% of the
  bandwidth; that scales every configuration alike and barely moves the ratios);
- attention reads the KV of a fixed `context` per request (the prompt plus part of the
  answer), for at most `MAX_REQUESTS` requests a forward: at these lengths under 1% of the
  weights' bytes a request;
- prefill is one forward over the prompt's rows at the same roofline, for the draft model
  too wherever it drafts;
- SoT: the skeleton decodes at batch 1, then the branches' prompts prefill in one forward
  and the branches decode together, the batch shrinking as the shorter ones finish;
- speculation: every step of a batch of `bs` commits 1 + the expected accepted drafts at the
  budget `speedup_ceiling` finds best for that batch and acceptance (a fluid model: expected,
  not sampled, tokens per step); at no gain it does not draft and costs plain steps.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_specsot.bench.ceiling import specsot_part, speedup_ceiling
from sglang_specsot.costs.cost_model import CostModel, ForwardCost

BF16_BYTES = 2
MAX_REQUESTS = 8  # the largest batch this prediction runs: one SoT answer's branches
PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2-style decoder's shape (q/k/v biases, SwiGLU MLP, RMSNorm)."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    def layer_params(self) -> int:
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + (q + 2 * kv) + q * self.hidden
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_params() + embeddings + self.hidden

    def matmul_params(self) -> int:
        """The weights every row multiplies: all but an untied input embedding (a gather)."""
        return self.params() - (0 if self.tied else self.vocab * self.hidden)

    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * BF16_BYTES


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's published peaks and the per-forward overhead assumed on top of the roofline."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float  # dense, no sparsity
    overhead_ms: float  # per forward: graph launch, sampling, the scheduler's share


# NVIDIA H100 Tensor Core GPU datasheet, SXM5: 3.35 TB/s HBM3, 989 TFLOP/s dense BF16
# (1,979 with sparsity). 0.05 ms per forward: tens of microseconds of graph replay and sampling.
H100_SXM = GpuSpec("H100 SXM", 3.35e12, 989e12, overhead_ms=0.05)

QWEN25_0_5B = ModelShape("Qwen2.5-0.5B", 24, 896, 14, 2, 64, 4864, 151936, tied=True)
QWEN25_1_5B = ModelShape("Qwen2.5-1.5B", 28, 1536, 12, 2, 128, 8960, 151936, tied=True)
QWEN25_7B = ModelShape("Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, tied=False)
PAIRS = ((QWEN25_1_5B, QWEN25_0_5B), (QWEN25_7B, QWEN25_0_5B))


def roofline_ms(shape: ModelShape, gpu: GpuSpec, rows: int, context: int, max_requests: int = MAX_REQUESTS) -> float:
    """A forward of `rows` rows, each attending to `context` cached tokens, at the roofline
    (without the fixed overhead). Attention reads a request's KV once however many of its
    rows the forward holds (a prefill, a verify window), and the rows are assumed to come from
    at most `max_requests` requests, since the cost model knows rows, not requests."""
    kv = min(rows, max_requests) * context * shape.kv_bytes_per_token()
    read = shape.matmul_params() * BF16_BYTES + kv
    flops = 2 * shape.matmul_params() * rows + 4 * shape.layers * shape.q_heads * shape.head_dim * rows * context
    return 1e3 * max(read / gpu.hbm_bytes_per_s, flops / gpu.bf16_flops_per_s)


def roofline_cost(shape: ModelShape, gpu: GpuSpec, context: int) -> ForwardCost:
    """The roofline as the runtime's `ForwardCost`: probed at `PROBE_ROWS`, the fixed overhead
    as its (already learned) overhead."""
    probe = tuple(roofline_ms(shape, gpu, rows, context) for rows in PROBE_ROWS)
    return ForwardCost(PROBE_ROWS, probe, overhead_ms=gpu.overhead_ms)


@dataclass(frozen=True)
class AnswerShape:
    """One question's answer as the runs wrote it, in tokens, with the prompts it was asked in."""

    plain_tokens: int
    skeleton_tokens: int
    branch_tokens: tuple[int, ...]  # one per point
    plain_prompt: int = 40  # chat template + question
    skeleton_prompt: int = 420  # SoT's skeleton instructions and examples + question
    branch_prefix: int = 100  # the branches' shared prompt, before the skeleton (once)
    branch_prompt: int = 30  # each branch's own last line


def _spec_step(cost: CostModel, bs: int, p_by_depth: Sequence[float]) -> tuple[float, float]:
    """(ms, tokens committed per request) of one step of `bs` requests at the budget the
    ceiling finds best; a plain step where drafting gains nothing."""
    _, budget = speedup_ceiling(cost, bs, p_by_depth, draft_model=True, narrow_extend=True)
    if budget == 0:
        return cost.target.ms(bs), 1.0
    reach, accepted = 1.0, 0.0
    for p in p_by_depth[:budget]:
        reach *= p
        accepted += reach
    ms = cost.step_ms(bs, budget + 1, draft_steps=budget - 1, draft_extend=True, extend_rows=bs * (1.0 + reach))
    return ms, 1.0 + accepted


def _decode_ms(cost: CostModel, lengths: Iterable[int], p_by_depth: Sequence[float] | None) -> float:
    """Requests decoded together to `lengths` tokens each (the first comes from prefill), the
    batch shrinking as they finish; speculative when `p_by_depth` is given."""
    left = [float(n - 1) for n in lengths if n > 1]
    ms = 0.0
    while left:
        bs = len(left)
        step, tokens = _spec_step(cost, bs, p_by_depth) if p_by_depth else (cost.target.ms(bs), 1.0)
        ms += step
        left = [n - tokens for n in left if n - tokens > 1e-9]
    return ms


def _prefill_ms(cost: CostModel, rows: int, drafting: bool) -> float:
    ms = cost.target.ms(rows)
    return ms + (cost.draft.ms(rows) if drafting and cost.draft is not None else 0.0)


def predict_ms(cost: CostModel, shape: AnswerShape, p_by_depth: Sequence[float]) -> dict[str, float]:
    """End-to-end ms of one question under plain, SoT-only, SPECSOT-only and SpecSoT."""
    out = {}
    for name, sot, spec in (("plain", False, None), ("SoT-only", True, None),
                            ("SPECSOT-only", False, p_by_depth), ("SpecSoT", True, p_by_depth)):  # fmt: skip
        drafting = bool(spec)
        if not sot:
            out[name] = _prefill_ms(cost, shape.plain_prompt, drafting) + _decode_ms(cost, [shape.plain_tokens], spec)
            continue
        skeleton = _prefill_ms(cost, shape.skeleton_prompt, drafting) + _decode_ms(cost, [shape.skeleton_tokens], spec)
        prompts = shape.branch_prefix + shape.skeleton_tokens + shape.branch_prompt * len(shape.branch_tokens)
        out[name] = skeleton + _prefill_ms(cost, prompts, drafting) + _decode_ms(cost, shape.branch_tokens, spec)
    return out


def pooled_acceptance(states: Iterable[dict], source: str, min_reached: int = 30) -> tuple[list[float], list[int]]:
    """(p by depth, reached by depth) of one drafting source summed over `/server_info`-style
    `specsot` states, cut at the first depth reached fewer than `min_reached` times."""
    reached: list[int] = []
    accepted: list[int] = []
    for state in states:
        by_source = state.get("acceptance_by_depth", {}).get(source, {})
        for d, (r, a) in enumerate(zip(by_source.get("reached", []), by_source.get("accepted", []))):
            if d == len(reached):
                reached.append(0)
                accepted.append(0)
            reached[d] += r
            accepted[d] += a
    depth = next((d for d, r in enumerate(reached) if r < min_reached), len(reached))
    return [a / r for a, r in zip(accepted[:depth], reached[:depth])], reached


def specsot_states(path: Path) -> list[dict]:
    """The `specsot` states a step log holds: a server_info JSON (whole or trimmed to SPECSOT's
    part) or a server_state.jsonl."""
    text = path.read_text()
    docs = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else [json.loads(text)]
    return [specsot_part(d) for d in docs]


_NUMBERED = re.compile(r"^\s*\d+\.\s*", re.MULTILINE)


def sot_answer_shape(record: dict, plain_tokens: int) -> AnswerShape:
    """An SoT answer's token shape, from its text: the run records only the total generated
    tokens (skeleton + branches), so each part gets the share of them its characters are.
    A branch's text is its answer section less the point it repeats."""
    points = [p.strip() for p in _NUMBERED.split(record["skeleton"]) if p.strip()]
    sections = [s.strip() for s in _NUMBERED.split(record["answer"]) if s.strip()]
    branches = [max(1, len(s) - len(p)) for s, p in zip(sections, points)]
    chars = len(record["skeleton"]) + sum(branches)
    per_char = record["output_tokens"] / chars
    return AnswerShape(
        plain_tokens=plain_tokens,
        skeleton_tokens=max(1, round(len(record["skeleton"]) * per_char)),
        branch_tokens=tuple(max(1, round(b * per_char)) for b in branches),
    )


def median_ms(cost: CostModel, shapes: Sequence[AnswerShape], p_by_depth: Sequence[float]) -> dict[str, float]:
    """The median over questions of each configuration's predicted ms."""
    per_question = [predict_ms(cost, s, p_by_depth) for s in shapes]
    return {name: statistics.median(q[name] for q in per_question) for name in per_question[0]}


# The runs the prediction reads (paths from the repository root). Acceptance: every step log
# of a SPECSOT server with the 0.5B draft model; shapes: the Vicuna run's SoT-suitable
# questions, whose plain answers and SoT answers ran on one commit.
STEP_LOGS = (
    "benchmarks/e2e-holdout-step-decay-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b/server_state.jsonl",
    "benchmarks/e2e-holdout-token-map-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b/server_state.jsonl",
    "benchmarks/e2e-holdout1-sot-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b/b035232/server_state.jsonl",
    "benchmarks/bench-speculative-token-map-heldout-vicuna13-18-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b-db471b9/server_info-SPECSOT-ab.json",
    "benchmarks/bench-speculative-token-map-heldout-vicuna13-18-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b-db471b9/server_info-SPECSOT-hot-ab.json",
    "benchmarks/bench-speculative-token-map-rerun-vicuna13-18-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b-53946cd/server_info-SPECSOT-hot.json",
)
SHAPE_REPORT = "benchmarks/e2e-vicuna12-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b-a83993d/report.json"
SHAPE_ANSWERS = "tests/data/sot_answers.jsonl"
SHAPE_RUN, SHAPE_CONFIG = "e2e-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b", "SoT-server"
CONTEXT = 600  # KV tokens each row attends to: a prompt and about half a 384-token answer
OVERHEADS_MS = (0.01, 0.05, 0.2, 0.5)  # the sensitivity rows


def load_shapes(root: Path) -> list[AnswerShape]:
    """The SoT-suitable questions of the shape run, each with its plain answer's length."""
    report = json.loads((root / SHAPE_REPORT).read_text())
    plain = {q["question_id"]: q["tokens"] for q in report["per_question"] if q["config"] == "plain" and q["suitable"]}
    shapes = []
    for line in (root / SHAPE_ANSWERS).read_text().splitlines():
        record = json.loads(line)
        if record["run"] == SHAPE_RUN and record["config"] == SHAPE_CONFIG and record["question_id"] in plain:
            shapes.append(sot_answer_shape(record, plain[record["question_id"]]))
    if not shapes:
        raise ValueError(f"no {SHAPE_CONFIG} answers of run {SHAPE_RUN} in {SHAPE_ANSWERS} match {SHAPE_REPORT}")
    return shapes


def _row(label: str, ms: dict[str, float]) -> str:
    cells = " | ".join(f"{ms[n] / 1e3:.2f} s ({ms['plain'] / ms[n]:.2f}x)" for n in ms)
    return f"| {label} | {cells} |"


def prediction_table(root: Path, gpu: GpuSpec = H100_SXM) -> str:
    """The prediction as markdown: inputs, the table, and its sensitivity to the overhead."""
    states = [s for p in STEP_LOGS for s in specsot_states(root / p)]
    p_extend, reached = pooled_acceptance(states, "extend")
    _, ctx_reached = pooled_acceptance(states, "context")
    shapes = load_shapes(root)
    lines = [f"GPU: {gpu.name}, {gpu.hbm_bytes_per_s / 1e12:.2f} TB/s, {gpu.bf16_flops_per_s / 1e12:.0f} TFLOP/s bf16 "
             f"dense, {gpu.overhead_ms} ms fixed per forward, KV context {CONTEXT} tokens a request"]  # fmt: skip
    for shape in (QWEN25_1_5B, QWEN25_0_5B, QWEN25_7B):
        one = roofline_ms(shape, gpu, 1, CONTEXT)
        lines.append(f"{shape.name}: {shape.params() / 1e9:.3f}B params, forward of 1 row {one:.3f} ms "
                     f"(+{gpu.overhead_ms} ms), of 1024 rows {roofline_ms(shape, gpu, 1024, CONTEXT):.3f} ms")  # fmt: skip
    lines.append(f"acceptance ('extend', the 0.5B draft's chain; {len(STEP_LOGS)} step logs): p by depth "
                 f"{[round(p, 3) for p in p_extend]}, reached {reached} (SoT-context drafting reached "
                 f"{ctx_reached}: too few to use)")  # fmt: skip
    med = lambda f: statistics.median(f(s) for s in shapes)  # noqa: E731
    lines.append(f"answer shapes: {len(shapes)} SoT-suitable questions of {SHAPE_REPORT} and {SHAPE_ANSWERS}; "
                 f"medians: plain {med(lambda s: s.plain_tokens)} tokens, skeleton {med(lambda s: s.skeleton_tokens)}, "
                 f"points {med(lambda s: len(s.branch_tokens))}, branch {med(lambda s: statistics.median(s.branch_tokens))}, "
                 f"longest branch {med(lambda s: max(s.branch_tokens))}")  # fmt: skip
    names = ("plain", "SoT-only", "SPECSOT-only", "SpecSoT")
    lines += ["", "| target + draft | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for target, draft in PAIRS:
        cost = CostModel(roofline_cost(target, gpu, CONTEXT), roofline_cost(draft, gpu, CONTEXT))
        lines.append(_row(f"{target.name} + {draft.name}", median_ms(cost, shapes, p_extend)))
    lines += ["", "sensitivity to the fixed per-forward overhead (median latency, speed-up over plain):", "",
              "| target + draft, overhead | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]  # fmt: skip
    for target, draft in PAIRS:
        for overhead in OVERHEADS_MS:
            spec = GpuSpec(gpu.name, gpu.hbm_bytes_per_s, gpu.bf16_flops_per_s, overhead)
            cost = CostModel(roofline_cost(target, spec, CONTEXT), roofline_cost(draft, spec, CONTEXT))
            lines.append(_row(f"{target.name} + {draft.name}, {overhead} ms", median_ms(cost, shapes, p_extend)))
    return "\n".join(lines)
