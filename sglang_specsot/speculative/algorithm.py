"""The SPECSOT speculative algorithm: its identity and server-argument defaults.

Registered (speculative/registration.py) through SGLang's public `SpeculativeAlgorithm.register` (spec_info.py:67). Each
`is_*` predicate opts into a built-in code path (spec_registry.py:26-35); SPECSOT claims only
`is_standalone()` when it drafts with a separate draft model, because then its draft side *is*
SGLang's standalone draft worker, and `is_eagle()` (with `is_eagle3()`) when it drafts with an
EAGLE head, because then its draft side is SGLang's EAGLE V2 draft worker and the target must
capture the hidden states the head reads. What it overrides, and why, is said at each method.
"""

from __future__ import annotations

import logging

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative import vocab
from sglang_specsot.speculative.draft_kind import DraftKind, config_of, draft_kind, head_mismatch, vocab_size

logger = logging.getLogger(__name__)

NAME = "SPECSOT"
DEFAULT_NUM_DRAFT_TOKENS = 8
MAX_NUM_DRAFT_TOKENS = 64
# With a draft model: its chain length, and how many verify nodes the SoT context gets on top.
DEFAULT_MODEL_STEPS = 4
DEFAULT_CONTEXT_NODES = 3
MAX_TOPK = 10


def configured_draft_kind() -> DraftKind | None:
    """What this SGLang process drafts with besides the SoT context: a draft model, an EAGLE
    head, or nothing (None). Read lazily, per process: SGLang publishes its config bags before
    it sizes pools or builds workers; before that (argument handling in the launcher) nothing
    reads this."""
    try:
        path = sgl.get_spec().speculative_draft_model_path
    except ValueError:  # the "spec" namespace is not published in this process yet
        return None
    return None if path is None else draft_kind(path)


class SpecSoTAlgo(sgl.CustomSpecAlgo):
    """SPECSOT: SoT-context drafting verified as one token tree, on SGLang's spec-V2 schema."""

    # -- methods SGLang calls that CustomSpecAlgo lacks (0.5.23) ---------------------------

    def carries_draft_hidden_states(self) -> bool:
        # scheduler.py:1540 (disaggregation wire format): a vanilla draft LM, like a context
        # draft, needs no target hidden states; an EAGLE head does.
        return self.is_eagle()

    def need_topk(self) -> bool:
        # overlap_utils.py:381 / :510: with a draft model or head, the top-k of its last
        # draft-extend is relayed to the next step through the FutureMap (as STANDALONE's and
        # EAGLE's; a head's draft hidden state rides with it, spec_utils.py:407). Context
        # drafting relays nothing but bonus tokens (drafts come from host-side history).
        return configured_draft_kind() is not None

    def create_future_map(
        self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False
    ):
        # scheduler.py:1681: SGLang's FutureMap (seq_lens travel through publish/stash),
        # with a torch gather of the relayed top-k on CPU (speculative/future_map.py).
        from sglang_specsot.speculative.future_map import SoTFutureMap

        return SoTFutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def get_platform_worker_cls(self):
        # spec_info.py:303: out-of-tree platforms replace built-in workers only.
        return None

    # -- overrides of CustomSpecAlgo defaults ------------------------------------------------

    def is_standalone(self) -> bool:
        # With a draft model the draft side is SGLang's standalone draft worker, so opt into
        # STANDALONE's paths: draft-KV sizing (pool_configurator.py:262, :734), no hidden-state
        # capture for the draft (eagle_worker_common.py:195, :354), draft graph runners.
        return configured_draft_kind() is DraftKind.MODEL

    def is_eagle(self) -> bool:
        # With an EAGLE head the draft side is SGLang's EAGLE V2 draft worker: EAGLE's draft-KV
        # sizing (pool_configurator.py:262, :734), full hidden-state capture in the draft's
        # extend (eagle_worker_common.py:195), the head's hidden size for the relay
        # (eagle_utils.py:286), its verify graphs' capture mode (decode_cuda_graph_runner.py:2072).
        kind = configured_draft_kind()
        return kind is not None and kind.is_head

    def is_eagle3(self) -> bool:
        # The target captures the head's aux-layer hidden states (spec_aux_hidden_state.py:185,
        # attention_backend_setup.py:54) and the head keeps its own hot vocabulary
        # (eagle_worker_v2.py:325, :353).
        return configured_draft_kind() is DraftKind.EAGLE3

    def supports_grammar_overlap(self) -> bool:
        # scheduler.py:4694: our verify builds the grammar mask itself and takes no
        # grammar_barrier, so grammar batches run synchronously (is_standalone() would
        # otherwise turn this on in SpeculativeAlgorithm's sense).
        return False

    def has_draft_kv(self) -> bool:
        # allocation_sizing.py:38-62: only a draft model or head writes draft KV chains;
        # context drafting needs no per-topk page rounding (as NGRAM, spec_info.py:178).
        return configured_draft_kind() is not None

    def handle_server_args(self, server_args) -> None:
        """Fill SPECSOT's defaults and reject impossible combinations (a recording proxy)."""
        apply_defaults(server_args)


def _reject(flag: str, value, fix: str) -> None:
    raise ValueError(f"SPECSOT: {flag}={value!r} is not supported; {fix}")


def apply_defaults(sa) -> None:
    """Defaults first, then validation; every error names the flag and the fix."""
    if sa.speculative_draft_model_path is not None:
        _model_draft_defaults(sa)
    else:
        _context_draft_defaults(sa)
    if sa.page_size not in (None, 1):
        _reject("--page-size", sa.page_size, "use 1: tree verify moves accepted KV slot by slot")
    if sa.max_running_requests is None:
        sa.max_running_requests = 48  # as SGLang's built-ins (speculative_hook.py:1294)
    sa.enable_mixed_chunk = False  # verify batches cannot mix with prefill chunks
    if sa.device != "cpu":
        _no_decode_graphs(sa)


def _no_decode_graphs(sa) -> None:
    """SGLang captures no decode graph of its own for SPECSOT: the worker captures the
    target's verify graphs itself, one set per tier (speculative/verify_runners.py), once the
    pools exist (`init_cuda_graphs`); a capture that fails stops start-up, naming
    --disable-cuda-graph (verify_runners.verify_runner). SGLang's own capture at model load would be one width only, and the draft
    model's decode graphs (eagle_worker_v2.py:481) replay SGLang's chain, not SPECSOT's.

    The graph runners read the resolved `cuda_graph_config` (cuda_graph_setup.py:731), which
    SGLang derives from the flags before this hook runs (cuda_graph_hook.py:64,
    pipeline.py:191), so the config itself is rewritten; the flags are left as the user set
    them, for the worker to read (`adapter.verify_graphs_wanted`). (A CPU captures no graph
    without --enable-torch-compile, and refuses speculation with it: cpu_graph_runner.py:663.)
    """
    sa.cuda_graph_config = sgl.with_phase(sa.cuda_graph_config, sgl.Phase.DECODE, backend=sgl.Backend.DISABLED)


def _check_num_draft_tokens(n: int) -> None:
    if not 2 <= n <= MAX_NUM_DRAFT_TOKENS:
        _reject("--speculative-num-draft-tokens", n, f"use 2..{MAX_NUM_DRAFT_TOKENS} (tree nodes incl. the root)")


def _context_draft_defaults(sa) -> None:
    if sa.speculative_num_draft_tokens is None:
        sa.speculative_num_draft_tokens = DEFAULT_NUM_DRAFT_TOKENS
    n = sa.speculative_num_draft_tokens
    _check_num_draft_tokens(n)
    if sa.speculative_eagle_topk is None:
        sa.speculative_eagle_topk = 1
    if sa.speculative_eagle_topk != 1:
        _reject(
            "--speculative-eagle-topk", sa.speculative_eagle_topk,
            "context drafting builds irregular trees sized by --speculative-num-draft-tokens; "
            "drop the flag (it shapes a draft model's tree, with --speculative-draft-model-path)",
        )  # fmt: skip
    # KV reservation per decode is max(steps * topk, draft tokens) (allocation_sizing.py:38);
    # a verify window writes exactly n slots.
    if sa.speculative_num_steps is None:
        sa.speculative_num_steps = n - 1
    if sa.speculative_num_steps != n - 1:
        _reject("--speculative-num-steps", sa.speculative_num_steps, f"drop it (it is --speculative-num-draft-tokens - 1 = {n - 1})")


def _model_draft_defaults(sa) -> None:
    """Draft model: `steps` x `topk` shape its tree; the verify window (num_draft_tokens)
    holds that tree plus SoT-context nodes."""
    if sa.speculative_num_steps is None:
        sa.speculative_num_steps = DEFAULT_MODEL_STEPS
    if sa.speculative_eagle_topk is None:
        sa.speculative_eagle_topk = 1
    steps, topk = sa.speculative_num_steps, sa.speculative_eagle_topk
    if not 1 <= steps <= MAX_NUM_DRAFT_TOKENS - 1:
        _reject("--speculative-num-steps", steps, f"use 1..{MAX_NUM_DRAFT_TOKENS - 1} draft-model steps")
    if not 1 <= topk <= MAX_TOPK:
        _reject("--speculative-eagle-topk", topk, f"use 1 (a chain) .. {MAX_TOPK} (a tree)")
    if sa.speculative_num_draft_tokens is None:
        sa.speculative_num_draft_tokens = min(1 + steps * topk + DEFAULT_CONTEXT_NODES, MAX_NUM_DRAFT_TOKENS)
    n = sa.speculative_num_draft_tokens
    _check_num_draft_tokens(n)
    if topk == 1 and n < steps + 1:
        _reject(
            "--speculative-num-draft-tokens", n,
            f"a {steps}-step chain needs at least {steps + 1} nodes incl. the root; raise it, or lower --speculative-num-steps",
        )  # fmt: skip
    _check_draft(sa.model_path, sa.speculative_draft_model_path)


def _check_draft(target_path: str, draft_path: str) -> None:
    """Fail at launch, before any weight loads, where the draft cannot draft for the target.

    A path without config.json (a hub id, a GGUF file) is checked by the worker once loaded."""
    target, draft = config_of(target_path), config_of(draft_path)
    if target is None or draft is None:
        return
    kind = draft_kind(draft_path)
    if kind.is_head:
        _check_head(target, draft, draft_path, kind)
        return
    # A draft may have fewer ids than the target (Qwen2.5-0.5B's 151936 of 7B's 152064); the
    # worker checks the loaded tokenizers agree on the ids both have (vocab.py).
    t, d = vocab_size(target), vocab_size(draft)
    problem = None if t is None or d is None else vocab.size_problem(t, d)
    if problem is not None:
        _reject("--speculative-draft-model-path", draft_path, f"{problem}; {vocab.FIX}")


HEAD_FIX = "use an EAGLE head trained for this target (SpecForge's output directory), or drop the flag to draft from the SoT context alone"


def _check_head(target: dict, head: dict, path: str, kind: DraftKind) -> None:
    why = head_mismatch(target, head, kind)
    if why is not None:
        _reject("--speculative-draft-model-path", path, f"it is an {kind.value.upper()} head, but {why}; {HEAD_FIX}")
    architectures = head.get("architectures") or []
    if not sgl.model_architecture_known(architectures):
        _reject(
            "--speculative-draft-model-path", path,
            f"SGLang has no model class for its architectures {architectures}; {HEAD_FIX} "
            "(SpecForge's EAGLE-3 heads are LlamaForCausalLMEagle3)",
        )  # fmt: skip
    target_archs = target.get("architectures") or []
    if kind is DraftKind.EAGLE3 and sgl.model_class_can_capture_aux(target_archs) is False:
        _reject(
            "--speculative-draft-model-path", path,
            f"it is an EAGLE3 head, but SGLang's class for the target's architectures {target_archs} "
            "cannot capture the aux hidden states it reads; use an EAGLE(-2) head or a draft model for this target",
        )  # fmt: skip
