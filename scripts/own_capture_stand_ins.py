"""What scripts/own_capture_twin.py stands in for inside the engine's processes.

Each stand-in replaces only what a CPU has no equivalent for, or a gate that keeps a CPU off the
CUDA path; SGLang's graph runner, its buffers, its capture and replay logic and its Triton
attention backend run as they are. Installed after each target module is imported (a
`sys.meta_path` finder), so the engine imports everything as usual. On a GPU
(SPECSOT_OWN_CAPTURE_TWIN=cuda) none of the stand-ins is installed: only the test drafter mode
and the graph-vs-eager comparison (`patches`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import json
import os
import sys
import threading
from types import SimpleNamespace

_lock = threading.Lock()


# -- the CUDA graph object: a recorder ------------------------------------------------------------


def recorded_graphs_cls():
    from sglang.srt.model_executor.runner_backend.base_cuda_graph_backend import (
        BaseCudaGraphBackend,
    )

    class RecordedGraphs(BaseCudaGraphBackend):
        """SGLang's full-graph backend contract (full_cuda_graph_backend.py) with the graph
        replaced by a recording: two warm-up runs, then the captured callable (SGLang's
        `run_once`, which reads the runner's static buffers) and the attention metadata its
        kernels were launched with. A replay restores that metadata and re-runs the callable,
        as a CUDA graph re-launches its kernels with the arguments baked in at capture."""

        def __init__(self, cuda_graph_runner, **kwargs):
            self.runner = cuda_graph_runner
            self.recorded: dict = {}

        @contextlib.contextmanager
        def capture_session(self, stream):
            yield

        def capture_one(self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
            for _ in range(2):
                forward_fn()
                if post_warmup_hook is not None:
                    post_warmup_hook()
            forward_fn()
            metadata = getattr(self.runner.attn_backend, "forward_metadata", None)
            self.recorded[shape_key] = (forward_fn, metadata)

        def can_run(self, forward_batch, shape_key) -> bool:
            return shape_key in self.recorded

        @contextlib.contextmanager
        def replay_session(self):
            yield

        def replay(self, shape_key, static_forward_batch, **kwargs):
            forward_fn, metadata = self.recorded[shape_key]
            self.runner.attn_backend.forward_metadata = metadata
            return forward_fn()

        def cleanup(self) -> None:
            self.recorded.clear()

    return RecordedGraphs


@contextlib.contextmanager
def _no_capture_stream(stream=None):
    """SGLang's `graph_capture` (parallel_state.py:2302) enters a CUDA stream; a CPU has none."""
    yield SimpleNamespace(stream=stream)


def _graph_runner_module(module) -> None:
    import torch

    # decode_cuda_graph_runner.py:658 asks the device module whether a graph is being captured,
    # to plant a CUDA event marker in it; torch.cpu has no such query, and no graph captures.
    if not hasattr(torch.cpu, "is_current_stream_capturing"):
        torch.cpu.is_current_stream_capturing = lambda: False
    module.resolve_decode_backend = recorded_graphs_cls()
    module.graph_capture = _no_capture_stream
    module.get_or_create_global_graph_capture_stream = lambda: None


def _verify_mask(module) -> None:
    # eagle_utils.py:135: a CPU reads the QLEN_ONLY tree mask; Triton on CUDA reads FULL_MASK,
    # as SPECSOT's verify input lays it out here (SGLANG_SPECSOT_TREE_MASK_LAYOUT=full).
    module.default_tree_mask_mode = lambda: module.TreeMaskMode.FULL_MASK


def _forward_batch_info(module) -> None:
    # model_runner.py:1986: on a CPU only DECODE may replay a graph; on CUDA TARGET_VERIFY too.
    module.ForwardMode.is_cpu_graph = module.ForwardMode.is_cuda_graph


# -- SPECSOT's side: capture as on CUDA, the test drafter mode, graph vs eager --------------------


def _worker(module) -> None:
    from sglang_specsot.host import adapter

    original = module.SpecSoTWorker.init_cuda_graphs

    def init_cuda_graphs(self):
        """The worker's own capture, its CUDA gate answered as on a GPU that wants graphs."""
        device_type, wanted = self.device_type, adapter.verify_graphs_wanted
        self.device_type, adapter.verify_graphs_wanted = "cuda", lambda: True
        try:
            original(self)
        finally:
            self.device_type, adapter.verify_graphs_wanted = device_type, wanted

    module.SpecSoTWorker.init_cuda_graphs = init_cuda_graphs


def _oracle() -> tuple[dict, int]:
    data = json.loads(open(os.environ["SPECSOT_OWN_CAPTURE_ORACLE"]).read())
    answers = {tuple(p): a for p, a in zip(data["prompts"], data["answers"])}
    return answers, data["vocab"]


def _context_drafter(module) -> None:
    from own_capture_twin import oracle_tree

    from sglang_specsot.speculative.draft_tree import DraftTree

    original = module.ContextDrafting.draft
    answers, vocab = _oracle()
    steps = [0]

    def draft(self, batch, decision, *args, **kwargs):
        """Branching trees at every tier in turn (the test drafter mode)."""
        proposal = original(self, batch, decision, *args, **kwargs)
        widths = sorted({1, 2, *[1 << k for k in range(8)]} & set(range(1, max(decision.sizes) + 1)))
        width = widths[steps[0] % len(widths)]
        steps[0] += 1
        trees = []
        for req, tree in zip(batch.reqs, proposal.trees):
            made = oracle_tree(self.history(req), width, answers, vocab)
            trees.append(DraftTree(tuple(made[0]), tuple(made[1])) if made else tree)
        return dataclasses.replace(proposal, trees=tuple(trees))

    module.ContextDrafting.draft = draft


def _verify_runners(module) -> None:
    original = module.TierGraphVerify.forward
    log = os.environ["SPECSOT_OWN_CAPTURE_LOG"]

    def forward(self, target_worker, batch, width, pp_proxy_tensors=None):
        """The step's replay, then SGLang's eager forward of the same batch; both logits logged."""
        target = original(self, target_worker, batch, width, pp_proxy_tensors)
        if not target.can_run_cuda_graph:
            return target
        graph_logits = target.logits_output.next_token_logits.clone()
        runner, self.model_runner.decode_cuda_graph_runner = (
            self.model_runner.decode_cuda_graph_runner,
            None,
        )
        try:
            eager = target_worker.forward_batch_generation(batch, is_verify=True)
        finally:
            self.model_runner.decode_cuda_graph_runner = runner
        diff = float((graph_logits - eager.logits_output.next_token_logits).abs().max())
        trees = batch.spec_info.host_trees or ()
        branching = any(len(set(t.parents[1:])) < len(t.parents) - 1 for t in trees)
        with _lock, open(log, "a") as f:
            f.write(
                json.dumps(
                    {
                        "width": width,
                        "bs": len(trees),
                        "branching": branching,
                        "max_abs_diff": diff,
                    }
                )
                + "\n"
            )
        return target

    module.TierGraphVerify.forward = forward


# What a CPU has no equivalent for, or a gate that keeps a CPU off the CUDA path.
CPU_STAND_INS = {
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner": _graph_runner_module,
    "sglang.srt.model_executor.forward_batch_info": _forward_batch_info,
    "sglang.srt.layers.attention.verify_mask": _verify_mask,
    "sglang_specsot.speculative.worker": _worker,
}
# The test drafter mode and the graph-vs-eager comparison: on a CPU and on a GPU alike.
TEST_MODE = {
    "sglang_specsot.speculative.drafters.context": _context_drafter,
    "sglang_specsot.speculative.verify_runners": _verify_runners,
}


def _sync_count(module) -> None:
    import gpu_sync_count

    gpu_sync_count.install(module)


def patches(env=os.environ) -> dict[str, list]:
    """Module name -> what runs after it is imported: SPECSOT_OWN_CAPTURE_TWIN=1 the CPU twin
    (stand-ins and test mode), =cuda the GPU twin (test mode alone: real CUDA graphs, real
    Triton); SPECSOT_SYNC_LOG the per-step sync counter (scripts/gpu_sync_count.py)."""
    mode = env.get("SPECSOT_OWN_CAPTURE_TWIN")
    chosen: dict[str, list] = {}
    for table, on in ((CPU_STAND_INS, mode == "1"), (TEST_MODE, mode in ("1", "cuda"))):
        for name, patch in table.items() if on else ():
            chosen.setdefault(name, []).append(patch)
    if env.get("SPECSOT_SYNC_LOG"):
        chosen.setdefault("sglang_specsot.speculative.worker", []).append(_sync_count)
    return chosen


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs each of chosen[name] on the module right after `name` is first executed."""

    def __init__(self, chosen: dict[str, list]) -> None:
        self.chosen = chosen

    def find_spec(self, name, path, target=None):
        if name not in self.chosen:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _PatchingLoader(spec.loader, self.chosen[name])
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patches):
        self.loader, self.patches = loader, patches

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for patch in self.patches:
            patch(module)


def install() -> None:
    sys.meta_path.insert(0, _PatchAfterImport(patches()))
