"""How a verify forward runs: eagerly at any width, or by replaying the graph of its tier.

The worker *has* one of these; each runs the target's TARGET_VERIFY forward of a batch whose
trees are already padded to `tiers.padded(width)` and says whether a graph replayed.

- `EagerVerify`: every width is a tier; SGLang's eager forward (a CPU; a GPU with graphs
  turned off by flag, the reason reported).
- `TierGraphVerify`: one SGLang decode graph runner per tier, captured in TARGET_VERIFY mode
  with SPECSOT's dummy verify input (SGLang's runner subclassed so that `get_spec_info`
  returns it, `adapter.verify_graph_runner_cls`), each with its own attention backend (a runner's `init_cuda_graph_state` sizes its backend's buffers, which
  its graphs read by address). A step installs its tier's pair on the target's model runner,
  as SGLang's `EAGLEWorkerV2.apply_runtime_state` does, and SGLang's own dispatch
  (model_runner.py:1990-2010, `can_run_graph`) replays the graph or falls back to eager.
- `static_shape.StaticShapeVerify`: the CPU twin of `TierGraphVerify`'s replays.
"""

from __future__ import annotations

import logging
import functools
from dataclasses import dataclass

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.backend_choice import GRAPHS_WITH_TRITON
from sglang_specsot.speculative.policy.tiers import TierCounts, VerifyTiers
from sglang_specsot.speculative.verify_input import dummy_verify_input

logger = logging.getLogger(__name__)


class EagerVerify:
    """SGLang's eager TARGET_VERIFY forward; every width is a tier."""

    def __init__(self, window: int, reason: str):
        self.tiers = VerifyTiers.every(window)
        self.counts = TierCounts()
        self.reason = reason  # why no graph replays, for /server_info

    def forward(self, target_worker, batch, width: int, pp_proxy_tensors=None):
        target = target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True)
        self.counts.count(width, replayed=False)
        return target

    def tier_backend(self, width: int) -> None:
        """No tier has an attention backend of its own: the model runner's serves every width."""
        return None

    def info(self) -> dict:
        return {"graphs": False, "why_not": self.reason, "tiers": list(self.tiers.widths), **self.counts.info()}


@dataclass(frozen=True)
class TierState:
    """One tier's captured verify: the graphs and the attention backend they read."""

    width: int
    attn_backend: object
    graph_runner: object  # SGLang's DecodeCudaGraphRunner, captured at `width` rows per request


class TierGraphVerify:
    """Per tier, SGLang's decode graph runner captured in TARGET_VERIFY mode; each step runs
    on its tier's, through SGLang's own replay-or-eager dispatch."""

    def __init__(self, tiers: VerifyTiers, states: dict[int, TierState], model_runner):
        missing = [w for w in tiers.widths if w not in states]
        assert not missing, f"SPECSOT: no captured verify state for tiers {missing}"
        self.tiers, self.states, self.model_runner = tiers, states, model_runner
        self.counts = TierCounts()

    def forward(self, target_worker, batch, width: int, pp_proxy_tensors=None):
        assert width in self.states, f"SPECSOT: verify width {width} is not a captured tier {self.tiers.widths}"
        state = self.states[width]
        self.model_runner.attn_backend = state.attn_backend
        self.model_runner.decode_cuda_graph_runner = state.graph_runner
        target = target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True)
        self.counts.count(width, replayed=bool(target.can_run_cuda_graph))
        return target

    def tier_backend(self, width: int):
        """The attention backend tier `width`'s graphs read (by address: a tree mask written
        into its buffer is what they see), or None where `width` is no tier."""
        state = self.states.get(width)
        return None if state is None else state.attn_backend

    def info(self) -> dict:
        backend = type(self.states[self.tiers.window].attn_backend).__name__
        why = {"attention_backend_why": GRAPHS_WITH_TRITON} if backend.startswith("Triton") else {}
        return {"graphs": True, "tiers": list(self.tiers.widths), "attention_backend": backend, **why,
                **self.counts.info()}  # fmt: skip


def capture_tier_graphs(model_runner, tiers: VerifyTiers) -> TierGraphVerify:
    """Capture every tier's verify graphs, widest first (smaller captures reuse its pool),
    each with SPECSOT's verify input and its tree mask (an EAGLE head's target graphs also
    output every row's hidden states, which its draft-extend reads)."""
    dummy = functools.partial(dummy_verify_input, capture_hidden=model_runner.spec_algorithm.is_eagle())
    states = {}
    for width in sorted(tiers.widths, reverse=True):
        backend, runner = sgl.capture_verify_graphs(model_runner, width, dummy)
        states[width] = TierState(width, backend, runner)
        logger.info("SPECSOT captured verify graphs at width %d for batch sizes %s", width, runner.capture_bs)
    return TierGraphVerify(tiers, states, model_runner)


def verify_runner(model_runner, tiers: VerifyTiers) -> TierGraphVerify:
    """The verify runner of a GPU server that wants graphs: graphs at `tiers`. A capture that
    fails stops the start-up: verifying eagerly instead would serve at a fraction of the speed
    the user asked for with nothing but a log line to say so."""
    try:
        return capture_tier_graphs(model_runner, tiers)
    except Exception as exc:
        raise RuntimeError(
            f"SPECSOT: capturing the target's verify graphs at widths {list(tiers.widths)} failed "
            f"({type(exc).__name__}: {exc}). Fix the cause, or pass --disable-cuda-graph (or "
            "--disable-decode-cuda-graph) to verify eagerly"
        ) from exc
