"""A decode step makes the host wait for the device at most once (issue 83, deliver 5).

The worker's real draft, verify and draft-extend run on a CPU with the target's forward and
SGLang's tree sampling stood in by device-only fakes; `SyncCounter` counts the reads of
device tensors our code makes that a CUDA run would block on. Context drafting needs one a
step (the committed tokens its next draft reads); a draft model adds none: its tree's one read
also waits for the previous step's committed tokens, settled after it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative import step_log
from sglang_specsot.speculative.host_sync import PendingCommit
from sglang_specsot.speculative.inputs import SoTDraftInput
from sglang_specsot.speculative.model_draft import read_trees
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.tiers import VerifyTiers
from sglang_specsot.speculative.tree_masks import TreeMaskLayout
from tests.unit.speculative.builders import WINDOW, context_worker, draft_model, model_worker
from tests.unit.speculative.sync_counter import SyncCounter

DEVICE = torch.device("cpu")  # "the device": our code names the host "cpu", the device by a variable
VOCAB = 64
PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # a repeating prompt: the SoT context drafts from it
STEPS = 4


class Target:
    """The target's verify forward: logits whose argmax is the next token of PROMPT's cycle."""

    tiers = VerifyTiers.every(WINDOW)

    def forward(self, target_worker, batch, width: int, pp_proxy_tensors=None):
        following = torch.tensor([6, 7, 8, 5], device=DEVICE)[(batch.input_ids - 5).clamp(0, 3)]
        logits = torch.nn.functional.one_hot(following, VOCAB).float()
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=None),
                               can_run_cuda_graph=False)  # fmt: skip

    def tier_backend(self, width: int) -> None:
        return None  # no captured tier: the worker writes a new mask each step

    def info(self) -> dict:
        return {}


def greedy_sample(verify_input, batch, logits_output, grammar_mask, watermark_state=None):
    """SGLang's tree sampling, greedily and on the device only: a node is accepted where its
    token is the target's argmax at its parent, its parent accepted (a chain along first children)."""
    n, bs = verify_input.draft_token_num, len(batch.reqs)
    predict = logits_output.next_token_logits.argmax(-1).to(torch.int32)
    tokens = verify_input.draft_token.view(bs, n)
    child = verify_input.retrieve_next_token  # shape: (bs, n)
    node = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    alive = torch.ones(bs, dtype=torch.bool, device=DEVICE)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32, device=DEVICE)
    rows = torch.arange(bs, device=DEVICE)
    accept_index[:, 0] = (rows * n).to(torch.int32)
    accept_lens = torch.ones(bs, dtype=torch.int32, device=DEVICE)
    for depth in range(1, n):
        nxt = child[rows, node]
        ok = alive & (nxt >= 0) & (tokens[rows, nxt.clamp(min=0)] == predict.view(bs, n)[rows, node])
        accept_index[:, depth] = torch.where(ok, rows * n + nxt, -1).to(torch.int32)
        accept_lens += ok.to(torch.int32)
        node, alive = torch.where(ok, nxt, node), ok
    return predict, accept_lens, accept_index


class DraftModel(SimpleNamespace):
    """A draft model's chain (the next tokens of PROMPT's cycle), made on the device and read
    back as SGLang's draft output is (`read_trees`); its extend relays the bonus token."""

    def draft_trees(self, batch, steps=None, stop=None):
        bs, depth = len(batch.reqs), self.max_steps
        chain = [batch.spec_info.bonus_tokens.to(torch.int64)]
        for _ in range(depth):
            chain.append(torch.tensor([6, 7, 8, 5], device=DEVICE)[(chain[-1] - 5).clamp(0, 3)])
        nodes = torch.arange(1, depth + 2, device=DEVICE)
        links = torch.where(nodes <= depth, nodes, -1).expand(bs, depth + 1)
        verify_input = SimpleNamespace(draft_token=torch.stack(chain, dim=1).flatten(), retrieve_next_token=links,
                                       retrieve_next_sibling=torch.full_like(links, -1))  # fmt: skip
        return read_trees(verify_input, bs)

    def extend_after_verify(self, batch, result):
        bonus = result.next_draft_input.bonus_tokens
        result.next_draft_input = SoTDraftInput(bonus_tokens=bonus, topk_p=torch.ones(len(bonus), 1, device=DEVICE),
                                                topk_index=bonus.view(-1, 1).to(torch.int64))  # fmt: skip


@pytest.fixture
def sglang_stand_ins(monkeypatch):
    """SGLang's calls in verify that need a server's pools stood in by device-only ones."""
    nothing = lambda *args, **kwargs: None  # noqa: E731
    for name in ("record_stream_for_v2_verify", "prepare_mamba_track_for_verify",
                 "commit_mamba_states_after_verify", "move_accept_tokens_to_target_kvcache"):  # fmt: skip
        monkeypatch.setattr(sgl, name, nothing)
    monkeypatch.setattr(sgl, "eagle_sample", greedy_sample)
    monkeypatch.setattr(sgl, "sanitize_nan_logits", nothing)
    monkeypatch.setattr(sgl, "simulated_accept_len", lambda: 0)


def _on_device(worker) -> None:
    worker.device, worker.mask_layout = DEVICE, TreeMaskLayout.FULL  # FULL: the GPU's layout
    worker.target_capture, worker._target_worker, worker.token_to_kv_pool_allocator = None, None, None
    worker.model_runner = SimpleNamespace(model_config=SimpleNamespace(context_len=256), watermark_state=None)
    worker.verifier = Target()
    for policy in worker.planners.values():
        policy.tiers = worker.verifier.tiers


def _batch(counter: SyncCounter, bs: int) -> SimpleNamespace:
    params = SimpleNamespace(max_new_tokens=64, custom_params=None)
    reqs = [SimpleNamespace(rid=f"r{b}", origin_input_ids_unpadded=PROMPT[:-1], output_ids=[PROMPT[-1]],
                            sampling_params=params, finished=lambda: False) for b in range(bs)]  # fmt: skip
    seq_lens = torch.full((bs,), len(PROMPT) - 1)  # the bonus token (PROMPT's last) is not yet in the KV
    batch = SimpleNamespace(
        reqs=reqs, forward_mode=sgl.ForwardMode.DECODE, seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()), req_pool_indices=torch.arange(bs),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(bs * 256).view(bs, 256)),
        sampling_info=SimpleNamespace(has_custom_logit_processor=False, is_all_greedy=True, logit_bias=None,
                                      acc_additive_penalties=None, acc_scaling_penalties=None),
        has_grammar=False, return_logprob=False, input_ids=None, out_cache_loc=None,
        spec_info=SoTDraftInput.from_bonus(torch.full((bs,), PROMPT[-1])),
    )  # fmt: skip
    counter.device(batch.seq_lens, batch.req_pool_indices, batch.req_to_token_pool.req_to_token, batch.spec_info.bonus_tokens)
    return batch


def _steps(worker, bs: int = 3) -> tuple[list[int], SyncCounter]:
    """Blocking reads per decode step of STEPS steps, as the scheduler drives them."""
    counter = SyncCounter()
    batch = _batch(counter, bs)
    with counter:
        per_step = drive(worker, batch, counter)
    return per_step, counter


def drive(worker, batch, counter: SyncCounter, steps: int = STEPS) -> list[int]:
    """`steps` decode steps of `batch` as the scheduler drives them (inside `counter`); the
    blocking reads each step made."""
    per_step = []
    for _ in range(steps):
        before = len(counter.syncs)
        result = worker.forward_batch_generation(batch)
        per_step.append(len(counter.syncs) - before)
        # The scheduler's part between steps, on the device: the committed length and the
        # relayed draft input.
        batch.seq_lens = result.new_seq_lens
        batch.seq_lens_cpu, batch.seq_lens_sum = None, None
        batch.spec_info = result.next_draft_input
    return per_step


def test_sync_count_context_drafting_waits_once_a_step(sglang_stand_ins, tmp_path, monkeypatch):
    monkeypatch.setenv(step_log.ENV, str(tmp_path / "steps.jsonl"))
    worker = context_worker(None, step_log=step_log.StepLog.from_env())  # the whole window every step
    _on_device(worker)
    per_step, counter = _steps(worker)
    assert per_step == [1] * STEPS, counter.syncs
    assert all("host_sync" in where for where in counter.syncs), counter.syncs  # the committed tokens
    # The steps drafted and verify took drafts (the prompt repeats): what was counted is a real step's.
    history = worker.context.context.tokens("r0")
    assert len(history) > len(PROMPT) + STEPS and history[len(PROMPT) :][:4] == [7, 8, 5, 6], history


def test_sync_count_draft_model_adds_no_wait(sglang_stand_ins):
    config = AdaptiveConfig.default(WINDOW - 1)
    model = DraftModel(**vars(draft_model(max_steps=3, variable_steps=False, keeps_confidence=False)))
    worker = model_worker(config, model, deferred=False)
    assert worker.drafter.settles_late
    _on_device(worker)
    per_step, counter = _steps(worker)
    assert per_step == [1] * STEPS, counter.syncs
    assert all("model_draft" in where for where in counter.syncs), counter.syncs  # the tree's read alone
    history = worker.context.context.tokens("r0")
    assert history[len(PROMPT) :][:4] == [7, 8, 5, 6], history
    assert worker._pending is not None  # the last step's tokens wait for the next draft


def test_sync_count_counts_what_would_block():
    # The counter's own controls: every read of device memory waits; a host buffer filled by a
    # non-blocking copy waits only if no wait came after the copy was queued; a pageable copy
    # to the device waits, a non-blocking one does not.
    counter = SyncCounter(ours=__name__)
    a = torch.arange(4)
    counter.device(a)
    with counter:
        assert (a + 1).tolist() == [1, 2, 3, 4]
        early, late = torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64)
        early.copy_(a * 2, non_blocking=True)
        assert (a * 3).cpu().tolist() == [0, 3, 6, 9]  # waits: the copy to `early` is done after it
        late.copy_(a * 4, non_blocking=True)
        assert early.tolist() == [0, 2, 4, 6] and late.tolist() == [0, 4, 8, 12]
        host = torch.tensor([1, 2])
        host.to(DEVICE)
        host.to(DEVICE, non_blocking=True)
        (a + 3).sum().item()
    waits = [s.split(": ")[1] for s in counter.syncs]
    assert waits == ["tolist", "cpu", "tolist of a copy still on its way", "pageable to(device)", "item"], counter.syncs


def test_pending_commit_reads_lengths_and_rows_in_one_copy():
    pending = PendingCommit(torch.tensor([2, 1]), torch.tensor([4, 5, 6, 7, 8, 9]), width=3)
    committed = pending.settle()
    assert committed.lens == [2, 1] and committed.rows == [[4, 5, 6], [7, 8, 9]]
