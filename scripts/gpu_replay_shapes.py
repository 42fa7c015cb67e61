"""The replay stage's models and engines (scripts/gpu_stage_replay.py): the pairs' shapes as
Qwen2 configs for SGLang's dummy weights, and each engine's arguments and environment."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import gpu_replay_answers as answers
from gpu_random_qwen2 import Qwen2Shape
from gpu_replay_answers import Limits, TraceFolder

# SPECSOT's replay opt-in, with SGLANG_SPECSOT_REPLAY=<trace.jsonl> (speculative/replay.py).
REPLAY_ENV = {"SGLANG_SPECSOT_REPLAY_OPT_IN": "forced-acceptance"}


@dataclass(frozen=True)
class PairShape:
    """A target and its draft, as Qwen2 configs; the draft's vocabulary may be a prefix."""

    target: Qwen2Shape
    draft: Qwen2Shape
    target_tied: bool = True


def _qwen2(hidden, layers, heads, kv_heads, intermediate, vocab) -> Qwen2Shape:
    return Qwen2Shape(hidden, layers, heads, kv_heads, intermediate, vocab)


QWEN05 = _qwen2(896, 24, 14, 2, 4864, 151936)  # Qwen2.5-0.5B, tied
DEVICE_PAIRS = {
    "1.5b": PairShape(_qwen2(1536, 28, 12, 2, 8960, 151936), QWEN05),  # tied
    "7b": PairShape(_qwen2(3584, 28, 28, 4, 18944, 152064), QWEN05, target_tied=False),
}
# The same two cases in 2-layer shapes: a shared vocabulary, then a draft's prefix of it.
TINY_DRAFT = _qwen2(32, 2, 2, 1, 64, 500)
SMOKE_PAIRS = {
    "1.5b": PairShape(_qwen2(64, 2, 4, 2, 128, 500), TINY_DRAFT),
    "7b": PairShape(_qwen2(64, 2, 4, 2, 128, 512), TINY_DRAFT, target_tied=False),
}


@dataclass(frozen=True)
class ReplayPlan:
    pairs: dict[str, PairShape]
    dtype: str
    answers: int  # answers timed per configuration (the traced questions cycled)
    max_new: int | None = None  # the smoke's cap on new tokens per request
    max_prompt: int | None = None  # the smoke's cap on prompt tokens
    # The warm-up's cap on new tokens: compiles and captures happen in an answer's first steps.
    warmup_max_new: int | None = 64
    # A pair starts only with this much of the stage's time left.
    start_reserve_s: float = 120
    stop_reserve_s: float = 30  # kept for shutting the engines down
    engine_start_s: float = 200  # one engine's start-up, at most


DEVICE_REPLAY = ReplayPlan(DEVICE_PAIRS, "bfloat16", answers=8)
SMOKE_REPLAY = ReplayPlan(
    SMOKE_PAIRS,
    "float32",
    answers=2,
    max_new=10,
    max_prompt=16,
    start_reserve_s=150,
    engine_start_s=300,
)


def write_config(shape: Qwen2Shape, tied: bool, dtype: str, out: Path) -> Path:
    """A Qwen2 config.json for SGLang's dummy weights (load_format="dummy"): nothing else."""
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, architectures=["Qwen2ForCausalLM"],
        bos_token_id=0, eos_token_id=1, dtype=dtype,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    return out


def on_cpu() -> bool:
    """Whether the engines run on SPECSOT's CPU runtime (the smoke) rather than SGLang's CUDA path."""
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


def base_kwargs(model: Path, plan: ReplayPlan, max_bs: int, share: float) -> dict:
    """An engine's arguments: dummy weights, token ids in and out, the CUDA path (Triton, decode
    graphs up to the widest SoT batch) or the CPU runtime. `share`: the part of the GPU's
    free memory this engine takes (SGLang sizes its pool from what is free at its start)."""
    common = dict(model_path=str(model), load_format="dummy", dtype=plan.dtype, skip_tokenizer_init=True,
                  sampling_backend="pytorch", random_seed=0, log_level="warning")  # fmt: skip
    if on_cpu():
        # sleep_on_idle: an idle scheduler waits on its socket (idle_sleeper.py) rather than
        # spinning, so the two engines not answering leave this CPU's cores to the one that is.
        cpu = dict(
            device="cpu",
            attention_backend="specsot_cpu",
            max_total_tokens=8192,
            sleep_on_idle=True,
        )
        return common | cpu
    # disable_prefill_cuda_graph: as the parity stage (sgl_kernel.weak_ref_tensor has no stand-in).
    return common | dict(attention_backend="triton", mem_fraction_static=share, cuda_graph_max_bs_decode=max_bs,
                         disable_prefill_cuda_graph=True)  # fmt: skip


def engine_specs(
    folder: TraceFolder, dirs: dict[str, Path], plan: ReplayPlan, max_bs: int
) -> dict[str, tuple[dict, dict]]:
    """(kwargs, environment) of the plain, STANDALONE and SPECSOT engines, in start order."""
    normal_rids = [a.specsot_rid for a in folder.answers if a.complete]  # those timed
    accept = answers.mean_accept_length(folder.trace, normal_rids)
    steps = answers.standalone_steps(accept)
    window, depth = answers.tree_window(folder.trace)
    # Started in turn, each takes a share of what is free then: about a quarter of the GPU each.
    shares = [0.75 / (3 - i) for i in range(3)]
    draft = {"speculative_draft_load_format": "dummy"}
    standalone = draft | {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": str(dirs["standalone_draft"]),
                          "speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}  # fmt: skip
    specsot = draft | {"speculative_algorithm": "SPECSOT", "speculative_draft_model_path": str(dirs["draft"]),
                       "speculative_num_steps": depth, "speculative_num_draft_tokens": window}  # fmt: skip
    target = dirs["target"]
    return {
        "plain": (base_kwargs(target, plan, max_bs, shares[0]), {}),
        "standalone": (base_kwargs(target, plan, max_bs, shares[1]) | standalone, {"SGLANG_SIMULATE_ACC_LEN": f"{accept:.4f}"}),
        "specsot": (base_kwargs(target, plan, max_bs, shares[2]) | specsot, REPLAY_ENV | {"SGLANG_SPECSOT_REPLAY": str(folder.trace_file)}),
    }  # fmt: skip


def pair_dirs(pair: PairShape, dtype: str, root: Path) -> dict[str, Path]:
    """The pair's configs; STANDALONE's draft has the target's vocabulary (SGLang requires it,
    standalone_worker_v2.py `_validate_vocab_compatibility`), SPECSOT's the draft's own."""
    dirs = {"target": write_config(pair.target, pair.target_tied, dtype, root / "target"),
            "draft": write_config(pair.draft, True, dtype, root / "draft")}  # fmt: skip
    same = Qwen2Shape(**{**asdict(pair.draft), "vocab": pair.target.vocab})
    dirs["standalone_draft"] = (
        dirs["draft"]
        if same == pair.draft
        else write_config(same, True, dtype, root / "standalone-draft")
    )
    return dirs


def pair_limits(plan: ReplayPlan, name: str) -> Limits:
    """Prompt ids every model of the pair has (the draft's vocabulary may be a prefix), and the
    smoke's caps on lengths."""
    pair = plan.pairs[name]
    return Limits(
        vocab=min(pair.target.vocab, pair.draft.vocab),
        max_new=plan.max_new,
        max_prompt=plan.max_prompt,
    )
