"""A GPU latency PREDICTION, not a measurement: what plain, SoT-only, SPECSOT-only and SpecSoT
would take end to end on a GPU, from a roofline, and every assumption it rests on.

Greedy acceptance and answer shapes are properties of the models and the text, not of the
hardware, so they come from real answers: a trace folder (`bench teacher-trace`: the 0.5B
draft's chain acceptance on the 1.5B's greedy answers, normal and SoT, and those answers'
shapes in tokens). Only the time of a forward is modelled:

    forward_ms(rows) = max(bytes read / (share x HBM bandwidth), 2 * params * rows / bf16 FLOP rate)
                       + a fixed per-forward overhead (graph replay, sampling, scheduler)

and a SPECSOT step pays `host_ms` more (its host code and blocking syncs). bytes read = the
bf16 weights the matrix products touch (the LM head included; an untied input embedding is a
gather) + the KV cache of `context` tokens per row. The runtime's `ForwardCost`/`CostModel`
prices every step and `speedup_ceiling` picks SPECSOT's draft budget; a step that would then be
slower than plain is a plain step, as SPECSOT's policy decides.

Neither the overhead nor the host time has been measured with SGLang's CUDA graphs, so the
table runs over both (OVERHEADS_MS x HOST_MS); the 7B's acceptance is the 1.5B's (the same
draft; a larger target agrees with it less or more, unmeasured). Further assumptions:
- one request on an idle GPU: no queueing, no other request's rows in any forward;
- attention reads the KV of a fixed `context` per request, for at most `MAX_REQUESTS`
  requests a forward;
- prefill is one forward over the prompt's rows at the same roofline, the draft's too;
- SoT: the skeleton decodes at batch 1, then the branches' prompts prefill in one forward
  and the branches decode together, the batch shrinking as the shorter ones finish;
- speculation: every step of a batch of `bs` commits 1 + the expected accepted drafts (a
  fluid model: expected, not sampled, tokens per step).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_specsot.bench.ceiling import speedup_ceiling
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
    """A GPU's published peaks, the share of its bandwidth kernels reach, and the time assumed
    on top of the roofline: per forward, and per SPECSOT step on the host."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float  # dense, no sparsity
    overhead_ms: float  # per forward: graph launch, sampling, the scheduler's share
    bandwidth_share: float = 1.0  # of the published bandwidth the decode kernels reach
    host_ms: float = 0.0  # per speculative step: SPECSOT's host code and its blocking syncs


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
    return 1e3 * max(read / (gpu.hbm_bytes_per_s * gpu.bandwidth_share), flops / gpu.bf16_flops_per_s)


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


def _spec_step(cost: CostModel, bs: int, p_by_depth: Sequence[float], host_ms: float = 0.0) -> tuple[float, float]:
    """(ms, tokens committed per request) of one step of `bs` requests at the budget the
    ceiling finds best, with `host_ms` of host time on top; a plain step where drafting then
    gains nothing (SPECSOT's policy never drafts slower than plain)."""
    _, budget = speedup_ceiling(cost, bs, p_by_depth, draft_model=True, narrow_extend=True)
    plain = cost.target.ms(bs), 1.0
    if budget == 0:
        return plain
    reach, accepted = 1.0, 0.0
    for p in p_by_depth[:budget]:
        reach *= p
        accepted += reach
    ms = cost.step_ms(bs, budget + 1, draft_steps=budget - 1, draft_extend=True, extend_rows=bs * (1.0 + reach)) + host_ms
    return (ms, 1.0 + accepted) if (1.0 + accepted) / ms > 1.0 / plain[0] else plain


def _decode_ms(cost: CostModel, lengths: Iterable[int], p_by_depth: Sequence[float] | None, host_ms: float = 0.0) -> float:
    """Requests decoded together to `lengths` tokens each (the first comes from prefill), the
    batch shrinking as they finish; speculative when `p_by_depth` is given."""
    left = [float(n - 1) for n in lengths if n > 1]
    ms = 0.0
    while left:
        bs = len(left)
        step, tokens = _spec_step(cost, bs, p_by_depth, host_ms) if p_by_depth else (cost.target.ms(bs), 1.0)
        ms += step
        left = [n - tokens for n in left if n - tokens > 1e-9]
    return ms


def _prefill_ms(cost: CostModel, rows: int, drafting: bool) -> float:
    ms = cost.target.ms(rows)
    return ms + (cost.draft.ms(rows) if drafting and cost.draft is not None else 0.0)


def predict_ms(cost: CostModel, shape: AnswerShape, p_by_depth: Sequence[float],
               p_sot: Sequence[float] | None = None, host_ms: float = 0.0) -> dict[str, float]:  # fmt: skip
    """End-to-end ms of one question under plain, SoT-only, SPECSOT-only and SpecSoT; the SoT
    parts speculate at `p_sot` (default: the normal answer's acceptance)."""
    out = {}
    p_sot = p_by_depth if p_sot is None else p_sot
    for name, sot, spec in (("plain", False, None), ("SoT-only", True, None),
                            ("SPECSOT-only", False, p_by_depth), ("SpecSoT", True, p_sot)):  # fmt: skip
        drafting = bool(spec)
        if not sot:
            out[name] = _prefill_ms(cost, shape.plain_prompt, drafting) + _decode_ms(cost, [shape.plain_tokens], spec, host_ms)
            continue
        skeleton = _prefill_ms(cost, shape.skeleton_prompt, drafting) + _decode_ms(cost, [shape.skeleton_tokens], spec, host_ms)
        prompts = shape.branch_prefix + shape.skeleton_tokens + shape.branch_prompt * len(shape.branch_tokens)
        out[name] = skeleton + _prefill_ms(cost, prompts, drafting) + _decode_ms(cost, shape.branch_tokens, spec, host_ms)
    return out


def median_ms(cost: CostModel, shapes: Sequence[AnswerShape], p_by_depth: Sequence[float],
              p_sot: Sequence[float] | None = None, host_ms: float = 0.0) -> dict[str, float]:  # fmt: skip
    """The median over questions of each configuration's predicted ms."""
    per_question = [predict_ms(cost, s, p_by_depth, p_sot, host_ms) for s in shapes]
    return {name: statistics.median(q[name] for q in per_question) for name in per_question[0]}


# The traced answers the prediction reads (bench teacher-trace: the 0.5B draft's chain of 4 on
# the 1.5B's greedy answers, normal and SoT, of tuning questions; docs/benchmarks.md#gpu).
TRACES = "benchmarks/traces-teacher-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b"
CONTEXT = 600  # KV tokens each row attends to: a prompt and about half a 384-token answer
# What nobody has measured on a GPU yet: SGLang's time a forward beyond the roofline (graph
# replay, sampling, the scheduler) and SPECSOT's host time a step; the table runs over both.
# 4.5 ms: a SPECSOT step's host time outside the target's forward on the 2-core Xeon
# (benchmarks/step-log-nodraft-b1-smollm2-135m-7c40c90: 72.3 ms plain steps of which 68.1 ms the
# forward; 78.4 of 73.8 drafting); a GPU host's cores are faster, its syncs are not free.
OVERHEADS_MS = (0.1, 0.3, 1.0)
HOST_MS = (0.0, 1.5, 4.5)
BANDWIDTH_SHARE = 0.8  # of the published peak that decode kernels reach (70-90%)


def load_shapes(folder: Path) -> list[AnswerShape]:
    """Each traced question that has a SoT answer, with its normal answer's length."""
    shapes = []
    for line in (folder / "answers.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["branch_tokens"]:
            shapes.append(AnswerShape(r["plain_tokens"], r["skeleton_tokens"], tuple(r["branch_tokens"]),
                                      r["plain_prompt_tokens"], r["skeleton_prompt_tokens"],
                                      r["branch_prefix_tokens"] - r["skeleton_tokens"], r["branch_suffix_tokens"]))  # fmt: skip
    if not shapes:
        raise ValueError(f"{folder}/answers.jsonl holds no question with a SoT answer; trace a run with SoT-server cells")
    return shapes


def load_acceptance(folder: Path) -> tuple[list[float], list[float], dict]:
    """(p by depth of the normal answers, of the SoT branches, the whole summary)."""
    summary = json.loads((folder / "acceptance.json").read_text())
    return summary["normal"]["p_by_depth"], summary.get("branch", summary["normal"])["p_by_depth"], summary


def _row(label: str, ms: dict[str, float]) -> str:
    cells = " | ".join(f"{ms[n] / 1e3:.2f} s ({ms['plain'] / ms[n]:.2f}x)" for n in ms)
    return f"| {label} | {cells} |"


def _cost(target: ModelShape, draft: ModelShape, gpu: GpuSpec) -> CostModel:
    return CostModel(roofline_cost(target, gpu, CONTEXT), roofline_cost(draft, gpu, CONTEXT))


def prediction_table(root: Path, gpu: GpuSpec = H100_SXM, traces: str = TRACES) -> str:
    """The prediction as markdown: its inputs, then median latency and speed-up over plain for
    each pair at every per-forward overhead and host time a step (OVERHEADS_MS x HOST_MS)."""
    folder = root / traces
    shapes = load_shapes(folder)
    p_normal, p_branch, summary = load_acceptance(folder)
    med = lambda f: statistics.median(f(s) for s in shapes)  # noqa: E731
    lines = [f"A PREDICTION, not a measurement. GPU: {gpu.name}, {BANDWIDTH_SHARE:.0%} of {gpu.hbm_bytes_per_s / 1e12:.2f} TB/s, "
             f"{gpu.bf16_flops_per_s / 1e12:.0f} TFLOP/s bf16 dense, KV context {CONTEXT} tokens a request",  # fmt: skip
             f"acceptance ({traces}, a 4-token chain of the 0.5B): normal answers p by depth {p_normal}, accept length "
             f"{summary['normal']['accept_length']:.2f} over {summary['normal']['steps']} steps; SoT branches {p_branch}",  # fmt: skip
             f"answer shapes: {len(shapes)} questions; medians: normal {med(lambda s: s.plain_tokens)} tokens, skeleton "
             f"{med(lambda s: s.skeleton_tokens)}, points {med(lambda s: len(s.branch_tokens))}, branch "
             f"{med(lambda s: statistics.median(s.branch_tokens))}, longest branch {med(lambda s: max(s.branch_tokens))}",  # fmt: skip
             "", "| target + draft, ms a forward, host ms a SPECSOT step | plain | SoT-only | SPECSOT-only | SpecSoT |",
             "|---|---|---|---|---|"]  # fmt: skip
    for target, draft in PAIRS:
        for overhead in OVERHEADS_MS:
            for host in HOST_MS:
                spec = GpuSpec(gpu.name, gpu.hbm_bytes_per_s, gpu.bf16_flops_per_s, overhead, BANDWIDTH_SHARE, host)
                ms = median_ms(_cost(target, draft, spec), shapes, p_normal, p_branch, host)
                lines.append(_row(f"{target.name} + {draft.name}, {overhead}, {host}", ms))
    return "\n".join(lines)
