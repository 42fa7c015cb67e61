"""The SPECSOT speculative algorithm: registration, identity, and server-argument defaults.

Registered through SGLang's public `SpeculativeAlgorithm.register` (spec_info.py:67). Each
`is_*` predicate opts into a built-in code path (spec_registry.py:26-35); SPECSOT claims only
`is_standalone()`, and only when it drafts with a separate draft model, because then its draft
side *is* SGLang's standalone draft worker. What it overrides, and why, is said at each method.
"""

from __future__ import annotations

import logging

from sglang_specsot.host import adapter as sgl

logger = logging.getLogger(__name__)

NAME = "SPECSOT"
DEFAULT_NUM_DRAFT_TOKENS = 8
MAX_NUM_DRAFT_TOKENS = 64
# With a draft model: its chain length, and how many verify nodes the SoT context gets on top.
DEFAULT_MODEL_STEPS = 4
DEFAULT_CONTEXT_NODES = 3
MAX_TOPK = 10


def draft_model_configured() -> bool:
    """Whether this SGLang process drafts with a draft model (read lazily, per process).

    SGLang publishes its config bags before it sizes pools or builds workers; before that
    (argument handling in the launcher) nothing reads this.
    """
    try:
        return sgl.get_spec().speculative_draft_model_path is not None
    except ValueError:  # the "spec" namespace is not published in this process yet
        return False


class SpecSoTAlgo(sgl.CustomSpecAlgo):
    """SPECSOT: SoT-context drafting verified as one token tree, on SGLang's spec-V2 schema."""

    # -- methods SGLang calls that CustomSpecAlgo lacks (0.5.23) ---------------------------

    def carries_draft_hidden_states(self) -> bool:
        # scheduler.py:1540 (disaggregation wire format): a vanilla draft LM, like a context
        # draft, needs no target hidden states.
        return False

    def need_topk(self) -> bool:
        # overlap_utils.py:381 / :510: with a draft model, the top-k of its last draft-extend
        # is relayed to the next step through the FutureMap (as STANDALONE's). Context
        # drafting relays nothing but bonus tokens (drafts come from host-side history).
        return self.is_standalone()

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
        # With --speculative-draft-model-path the draft side is SGLang's standalone draft
        # worker, so opt into STANDALONE's paths: draft-KV sizing (pool_configurator.py:262,
        # :734), no hidden-state capture for the draft (eagle_worker_common.py:195, :354),
        # draft graph runners. Without a draft model none of those apply.
        return draft_model_configured()

    def supports_grammar_overlap(self) -> bool:
        # scheduler.py:4694: our verify builds the grammar mask itself and takes no
        # grammar_barrier, so grammar batches run synchronously (is_standalone() would
        # otherwise turn this on in SpeculativeAlgorithm's sense).
        return False

    def has_draft_kv(self) -> bool:
        # allocation_sizing.py:38-62: only a draft model writes draft KV chains; context
        # drafting needs no per-topk page rounding (as NGRAM, spec_info.py:178).
        return self.is_standalone()

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
    pools exist (`init_cuda_graphs`), and verifies eagerly with a logged reason where that
    capture fails. SGLang's own capture at model load would be one width only, and the draft
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
    _check_draft_vocab(sa.model_path, sa.speculative_draft_model_path)


def _vocab_size(path: str) -> int | None:
    import json
    from pathlib import Path

    config = Path(path, "config.json")
    if not config.is_file():
        return None  # a hub id or a GGUF file: the worker checks once both are loaded
    data = json.loads(config.read_text())
    return data.get("vocab_size") or data.get("text_config", {}).get("vocab_size")


def _check_draft_vocab(target: str, draft: str) -> None:
    """Fail at launch, before any weight loads, when the vocab sizes differ."""
    t, d = _vocab_size(target), _vocab_size(draft)
    if t is not None and d is not None and t != d:
        _reject(
            "--speculative-draft-model-path", draft,
            f"its vocab_size is {d} but the target's is {t}; use a draft model with the target's "
            "tokenizer, or drop the flag to draft from the SoT context alone",
        )  # fmt: skip


def register_specsot() -> None:
    """Register SPECSOT with SGLang once per process (load_plugins may run us twice), and
    its attention-backend choice on CUDA, which argument resolution asks before the algorithm."""
    from sglang_specsot.speculative.backend_choice import register_tree_backend_choice

    register_tree_backend_choice()
    try:
        sgl.SpeculativeAlgorithm.from_string(NAME)
        return
    except ValueError:
        pass

    @sgl.SpeculativeAlgorithm.register(NAME, supports_overlap=True, spec_class=SpecSoTAlgo)
    def _worker_class(server_args):
        # One worker for every drafter: it picks the drafter from the server's flags.
        # Heavy imports: only in schedulers.
        from sglang_specsot.speculative.worker import SpecSoTWorker

        return SpecSoTWorker
