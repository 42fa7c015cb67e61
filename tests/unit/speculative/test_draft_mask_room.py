"""A draft model's tree mask fits the target backend installed when it drafts (issue 83, deliver 6).

SGLang's draft writes its tree mask into the target's installed attention backend's buffer
(`build_eagle_verify_input`, eagle_worker_common.py:405-413), checking the batch size only.
After a width-1 verify the installed backend is the width-1 tier's, whose FULL-layout buffer
holds one row per request: a draft tree at long context would be written past its end. Here
SGLang's own `build_tree_kernel_efficient` writes the tree, with its tree kernel run by our CPU
version (`cpu/kernels.build_tree_kernel_efficient_cpu`, which raises where CUDA's would write
out of bounds).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.cpu import kernels
from sglang_specsot.speculative.policy.tiers import VerifyTiers
from sglang_specsot.speculative.verify_runners import EagerVerify, TierGraphVerify, TierState
from sglang_specsot.speculative.worker import SpecSoTWorker

CONTEXT, BS, WINDOW, STEPS = 512, 2, 8, 3  # a 4-node draft chain per request


@pytest.fixture
def sglang_tree_kernel(monkeypatch):
    """SGLang's build_tree_kernel_efficient, its kernel the CPU version of CUDA's."""
    from sglang.kernels.ops.speculative import spec_tree

    monkeypatch.setattr(spec_tree, "_is_cpu", True, raising=False)
    monkeypatch.setattr(spec_tree, "sgl_build_tree_kernel_efficient_cpu", kernels.build_tree_kernel_efficient_cpu, raising=False)
    from sglang.srt.speculative.eagle_utils import build_tree_kernel_efficient

    return build_tree_kernel_efficient


def _tiers(model_runner) -> TierGraphVerify:
    """Captured tiers 1, 2, 4, 8, each backend with SGLang's FULL-layout mask for its width."""
    from sglang.srt.layers.attention.verify_mask import VerifyMask, tree_mask_numel
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    tiers = VerifyTiers.powers(WINDOW)
    states = {}
    for w in tiers.widths:
        buffer = torch.zeros(tree_mask_numel(TreeMaskMode.FULL_MASK, BS, w, CONTEXT), dtype=torch.uint8)
        backend = SimpleNamespace(verify_mask=VerifyMask(buffer=buffer, mode=TreeMaskMode.FULL_MASK, max_bs=BS))
        states[w] = TierState(w, backend, graph_runner=None)
    return TierGraphVerify(tiers, states, model_runner)


def _draft_writes_its_tree(build_tree_kernel_efficient, model_runner) -> torch.Tensor:
    """SGLang's draft tail: a chain of STEPS drafts per request at the context's end, its mask
    into the installed backend's buffer (where it fits the batch, as SGLang checks)."""
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    verify_mask = model_runner.attn_backend.verify_mask
    assert verify_mask.fits(BS)
    n = STEPS + 1
    seq_lens = torch.full((BS,), CONTEXT - n)  # long context: the window ends at the model's limit
    parents = torch.tensor([[-1, 0, 1]] * BS)  # topk * (steps - 1) + 1 columns
    top = torch.tensor([[0, 1, 2]] * BS)
    drafts = torch.tensor([[3, 4, 5]] * BS)
    out = build_tree_kernel_efficient(
        torch.tensor([1] * BS), parents, top, drafts, seq_lens, 0, 1, STEPS, n, TreeMaskMode.FULL_MASK,
        verify_mask.buffer,
    )  # fmt: skip
    return out[0]


def test_each_tier_names_the_backend_its_graphs_read():
    verifier = _tiers(SimpleNamespace(attn_backend=None, decode_cuda_graph_runner=None))
    for w in verifier.tiers.widths:
        assert verifier.tier_backend(w) is verifier.states[w].attn_backend
    assert verifier.tier_backend(3) is None  # not a tier: nothing of its own to write into
    assert EagerVerify(WINDOW, "a unit test").tier_backend(WINDOW) is None


def test_a_long_context_draft_tree_after_a_width_1_step_fits_the_installed_mask(sglang_tree_kernel):
    model_runner = SimpleNamespace(attn_backend=None, decode_cuda_graph_runner=None)
    verifier = _tiers(model_runner)
    target = SimpleNamespace(forward_batch_generation=lambda batch, **kw: SimpleNamespace(can_run_cuda_graph=True))
    verifier.forward(target, None, 1)  # a plain step: its tier's backend is installed
    assert model_runner.attn_backend is verifier.states[1].attn_backend
    worker = SpecSoTWorker.__new__(SpecSoTWorker)
    worker.verifier, worker.model_runner, worker._draft_worker = verifier, model_runner, object()
    worker.room_for_draft_mask()  # what the worker's draft does before the draft model drafts
    mask = _draft_writes_its_tree(sglang_tree_kernel, model_runner)
    # Each draft row sees its request's whole prefix and its chain's ancestors, nothing past.
    n, row = STEPS + 1, CONTEXT  # request 0's rows: CONTEXT - n prefix columns, then n tree columns
    window = mask[: n * row].view(n, row)[:, CONTEXT - n :].bool()
    assert torch.equal(window, torch.ones(n, n, dtype=torch.bool).tril())


def test_the_width_1_tiers_buffer_is_too_small_for_the_drafts_tree(sglang_tree_kernel):
    # The control: without the window's backend, SGLang's write runs past the buffer's end
    # (our CPU kernel raises where CUDA's would corrupt memory).
    model_runner = SimpleNamespace(attn_backend=None, decode_cuda_graph_runner=None)
    verifier = _tiers(model_runner)
    target = SimpleNamespace(forward_batch_generation=lambda batch, **kw: SimpleNamespace(can_run_cuda_graph=True))
    verifier.forward(target, None, 1)
    with pytest.raises((IndexError, RuntimeError, AssertionError)):
        _draft_writes_its_tree(sglang_tree_kernel, model_runner)


def test_the_verify_tree_is_written_into_its_tiers_mask_buffer():
    # Deliver 5: the step's FULL-layout mask goes into the buffer the tier's graphs read (as
    # SGLang's EAGLE writes its tree), the same cells a new mask would hold.
    import random

    from sglang_specsot.speculative.tree_masks import TreeMaskLayout
    from sglang_specsot.speculative.verify_input import build_verify_input
    from tests.unit.speculative.builders import random_tree

    model_runner = SimpleNamespace(attn_backend=None, decode_cuda_graph_runner=None)
    worker = SpecSoTWorker.__new__(SpecSoTWorker)
    worker.verifier, worker.mask_layout = _tiers(model_runner), TreeMaskLayout.FULL
    buffer = worker.mask_buffer(4, BS)
    assert buffer is worker.verifier.states[4].attn_backend.verify_mask.buffer
    assert worker.mask_buffer(4, BS + 1) is None  # past the captured batch size: a mask of its own
    rng = random.Random(0)
    trees = [random_tree(rng, 4) for _ in range(BS)]
    seq_lens = torch.tensor([30, 7])
    batch = SimpleNamespace(seq_lens=seq_lens, seq_lens_sum=37)
    made = build_verify_input(batch, trees, (), "cpu", TreeMaskLayout.FULL, CONTEXT)
    written = build_verify_input(batch, trees, (), "cpu", TreeMaskLayout.FULL, CONTEXT, mask_buffer=buffer)
    assert written.custom_mask.data_ptr() == buffer.data_ptr()
    assert torch.equal(written.custom_mask.bool(), made.custom_mask)
