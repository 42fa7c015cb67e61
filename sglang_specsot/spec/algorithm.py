"""The SPECSOT speculative algorithm: registration, identity, and server-argument defaults.

Registered through SGLang's public `SpeculativeAlgorithm.register` (spec_info.py:67). Every
`is_*` stays False: SPECSOT is none of SGLang's built-ins, and each of those predicates opts
into a built-in code path (brief §4.5) that would be wrong for it. What it overrides, and why,
is said at each method.
"""

from __future__ import annotations

import logging

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

logger = logging.getLogger(__name__)

NAME = "SPECSOT"
DEFAULT_NUM_DRAFT_TOKENS = 8
MAX_NUM_DRAFT_TOKENS = 64


class SpecSoTAlgo(CustomSpecAlgo):
    """SPECSOT: SoT-context drafting verified as one token tree, on SGLang's spec-V2 schema."""

    # -- methods SGLang calls that CustomSpecAlgo lacks (0.5.23) ---------------------------

    def carries_draft_hidden_states(self) -> bool:
        # scheduler.py:1540 (disaggregation wire format): no draft hidden states to ship.
        return False

    def need_topk(self) -> bool:
        # overlap_utils.py:381 / :510: nothing but bonus tokens is relayed through the
        # FutureMap (drafts come from host-side token history), so no top-k buffers and no
        # Triton gather_spec_extras, which has no CPU version.
        return False

    def create_future_map(
        self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False
    ):
        # scheduler.py:1681: the stock FutureMap; seq_lens travel through publish/stash.
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def get_platform_worker_cls(self):
        # spec_info.py:303: out-of-tree platforms replace built-in workers only.
        return None

    # -- overrides of CustomSpecAlgo defaults ------------------------------------------------

    def has_draft_kv(self) -> bool:
        # allocation_sizing.py:38-62: context drafting writes no draft KV, so the per-decode
        # reservation needs no per-topk page rounding (as NGRAM, spec_info.py:178).
        return False

    def handle_server_args(self, server_args) -> None:
        """Fill SPECSOT's defaults and reject impossible combinations (a recording proxy)."""
        apply_defaults(server_args)


def _reject(flag: str, value, fix: str) -> None:
    raise ValueError(f"SPECSOT: {flag}={value!r} is not supported; {fix}")


def apply_defaults(sa) -> None:
    """Defaults first, then validation; every error names the flag and the fix."""
    if sa.speculative_draft_model_path is not None:
        _reject(
            "--speculative-draft-model-path", sa.speculative_draft_model_path,
            "this release of SPECSOT drafts from the SoT context only (prompt, skeleton and "
            "sibling branches); drop the flag, or use --speculative-algorithm STANDALONE for "
            "draft-model speculation",
        )  # fmt: skip
    if sa.speculative_num_draft_tokens is None:
        sa.speculative_num_draft_tokens = DEFAULT_NUM_DRAFT_TOKENS
    n = sa.speculative_num_draft_tokens
    if not 2 <= n <= MAX_NUM_DRAFT_TOKENS:
        _reject("--speculative-num-draft-tokens", n, f"use 2..{MAX_NUM_DRAFT_TOKENS} (tree nodes incl. the root)")
    if sa.speculative_eagle_topk is None:
        sa.speculative_eagle_topk = 1
    if sa.speculative_eagle_topk != 1:
        _reject(
            "--speculative-eagle-topk", sa.speculative_eagle_topk,
            "context drafting builds irregular trees sized by --speculative-num-draft-tokens; drop the flag",
        )  # fmt: skip
    # KV reservation per decode is max(steps * topk, draft tokens) (allocation_sizing.py:38);
    # a verify window writes exactly n slots.
    if sa.speculative_num_steps is None:
        sa.speculative_num_steps = n - 1
    if sa.speculative_num_steps != n - 1:
        _reject("--speculative-num-steps", sa.speculative_num_steps, f"drop it (it is --speculative-num-draft-tokens - 1 = {n - 1})")
    if sa.page_size not in (None, 1):
        _reject("--page-size", sa.page_size, "use 1: tree verify moves accepted KV slot by slot")
    if sa.max_running_requests is None:
        sa.max_running_requests = 48  # as SGLang's built-ins (speculative_hook.py:1294)
    sa.enable_mixed_chunk = False  # verify batches cannot mix with prefill chunks
    if sa.device != "cpu":
        # decode_cuda_graph_runner.py:2069-2150 builds a dummy verify input only for
        # built-in algorithms; until SPECSOT provides one, capture no target decode graph.
        sa.disable_decode_cuda_graph = True


def register_specsot() -> None:
    """Register SPECSOT with SGLang once per process (load_plugins may run us twice)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        SpeculativeAlgorithm.from_string(NAME)
        return
    except ValueError:
        pass

    @SpeculativeAlgorithm.register(NAME, supports_overlap=True, spec_class=SpecSoTAlgo)
    def _worker_class(server_args):
        from sglang_specsot.spec.worker import SpecSoTWorker  # heavy: only in schedulers

        return SpecSoTWorker
