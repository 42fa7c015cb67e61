"""SPECSOT's own capture of the target's verify graphs, on SGLang's decode graph runner.

SGLang captures no decode graph for SPECSOT (speculative/algorithm.py turns its capture off):
the worker captures one set per verify tier (speculative/verify_runners.py) with these, each
under the config a verify of that width sees and with SPECSOT's verify input. Re-exported by
adapter.py, the one name space the rest of the package reads.
"""

from __future__ import annotations

import contextlib


def verify_graphs_wanted() -> bool:
    """Whether this server asked for decode graphs: not --disable-cuda-graph nor
    --disable-decode-cuda-graph, nor --cuda-graph-backend-decode disabled. SPECSOT's handle
    of the arguments turns SGLang's own decode capture off (speculative/algorithm.py), not
    these flags, so they still say what the user asked."""
    from sglang.srt.runtime_context import get_exec

    graph = get_exec().graph
    backend = graph.cuda_graph_backend_decode
    return not (graph.disable_cuda_graph or graph.disable_decode_cuda_graph or backend == "disabled")


def decode_graphs_asked(server_args) -> bool:
    """Whether the user's flags ask for decode graphs, as an override provider sees them while
    SGLang resolves the server's arguments (the raw flags that `verify_graphs_wanted` reads
    resolved once the server runs)."""
    off = getattr(server_args, "disable_cuda_graph", False) or getattr(server_args, "disable_decode_cuda_graph", False)
    return not (off or getattr(server_args, "cuda_graph_backend_decode", None) == "disabled")


@contextlib.contextmanager
def decode_graphs_on(width: int, num_steps: int | None = None):
    """SGLang's resolved config as a verify of `width` rows per request sees it, with decode
    graphs on (the capture-time override EAGLEWorkerV2._override_worker_state makes,
    eagle_worker_v2.py:1909-1980), for SPECSOT's own captures: SGLang's at model load is off
    (speculative/algorithm.py). Everything is restored when the block ends.

    `num_steps`: the draft model's steps, for its captures (its chain is shorter than the
    window, which also holds SoT-context nodes); a verify capture leaves it at `width - 1`.
    The draft runner sizes its out_cache_loc by this value and the draft worker's
    `draft_forward` checks it against its own `speculative_num_steps`, so the two must agree."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase
    from sglang.srt.runtime_context import get_context, get_exec, get_spec

    spec, graph = get_spec(), get_exec().graph
    backup = {
        "speculative_num_steps": spec.speculative_num_steps,
        "speculative_num_draft_tokens": spec.speculative_num_draft_tokens,
        "cuda_graph_config": graph.cuda_graph_config,
    }
    backend = graph.cuda_graph_backend_decode or Backend.FULL
    get_context().override(
        "specsot.verify_capture", speculative_num_steps=num_steps or max(width - 1, 1), speculative_num_draft_tokens=width,
        cuda_graph_config=with_phase(graph.cuda_graph_config, Phase.DECODE, backend=backend),
    )  # fmt: skip
    try:
        yield
    finally:
        get_context().override("specsot.verify_capture_restore", **backup)


def capture_verify_graphs(model_runner, width: int, dummy_input):
    """(attention backend, decode graph runner) of the target's TARGET_VERIFY at `width` rows
    per request, as EAGLEWorkerV2.build_adaptive_runtime_state builds a target state
    (eagle_worker_v2.py:1795-1825): a fresh backend, whose buffers the runner's graphs read.

    The runner is SGLang's decode graph runner class with its capture input replaced
    (`verify_graph_runner_cls`): `dummy_input(custom_mask, width)` builds the verify input every
    graph is captured with, from the runner's own static mask buffer."""
    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

    with decode_graphs_on(width):
        # The runner's graphs write their logits into the process's shared buffer, which SGLang
        # builds at start-up only when the target captures decode graphs (SPECSOT's target does
        # not); built here as ModelRunner.ensure_decode_cuda_graphs builds it, sized for `width`
        # rows per request (the cached one is kept when it is large enough).
        model_runner.graph_shared_output = GraphSharedOutput.create_for_model_runner(model_runner)
        init_new_workspace = model_runner.init_new_workspace
        try:
            backend = model_runner._get_attention_backend(init_new_workspace=True)
        finally:
            model_runner.init_new_workspace = init_new_workspace
        runner_cls = verify_graph_runner_cls(model_runner._decode_cuda_graph_runner_cls())
        runner = runner_cls(model_runner, dummy_input, attn_backend=backend, speculative_num_steps=max(width - 1, 1),
                            speculative_num_draft_tokens=width)  # fmt: skip
    return backend, runner


_verify_runner_classes: dict[type, type] = {}


def verify_graph_runner_cls(base: type) -> type:
    """SGLang's decode graph runner class `base`, capturing with a plugin's verify input.

    SGLang builds a graph's capture input in `capture_prepare` -> `get_spec_info`
    (decode_cuda_graph_runner.py:1166, :2069), which knows only its own algorithms (EAGLE,
    STANDALONE, DFlash, NGRAM) and returns None for any other: the graph is then captured
    without a tree mask (triton_backend.py:1321-1330 bakes USE_CUSTOM_MASK off) and every
    replay verifies the tree as a causal chain, whatever mask the replay copies in. The
    subclass returns the plugin's input instead, built on the runner's own mask buffer
    (`self.buffers.custom_mask`, which the replay's metadata fills) at its captured width."""
    if base not in _verify_runner_classes:

        class VerifyGraphRunner(base):
            def __init__(self, model_runner, dummy_input, **kwargs):
                self.dummy_input = dummy_input  # read by get_spec_info while __init__ captures
                super().__init__(model_runner, **kwargs)

            def get_spec_info(self, num_tokens: int):
                spec_info = self.dummy_input(self.buffers.custom_mask, self.speculative_num_draft_tokens)
                # As SGLang's EAGLE input (decode_cuda_graph_runner.py:2095): MTP-style
                # models read spec_info.hidden_states in their forward.
                spec_info.hidden_states = _zero_hidden_states(self.model_runner, num_tokens)
                return spec_info

        VerifyGraphRunner.__name__ = VerifyGraphRunner.__qualname__ = f"SpecSoTVerify{base.__name__}"
        _verify_runner_classes[base] = VerifyGraphRunner
    return _verify_runner_classes[base]


def _zero_hidden_states(model_runner, num_tokens: int):
    """Zero hidden states for `num_tokens` rows in the model's width, dtype and device."""
    import torch

    hidden = model_runner.model_config.hidden_size
    return torch.zeros((num_tokens, hidden), dtype=model_runner.dtype, device=model_runner.device)
