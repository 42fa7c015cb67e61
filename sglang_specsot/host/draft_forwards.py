"""What SPECSOT changes around SGLang's draft-model forwards: the context they run in, their
logits kept, a chain stopped early, a draft vocabulary narrower than the target's.

Each wraps or hooks one SGLang object for the length of a block (or, for the embedding
clamp, the draft runner's life); re-exported by adapter.py, the one name space the rest of
the package reads.
"""

from __future__ import annotations

import contextlib


def new_forward_batch(batch, model_runner):
    """The ForwardBatch SGLang's TpModelWorker builds from a ScheduleBatch (tp_worker.py:653)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    return ForwardBatch.init_new(batch, model_runner, capture_hidden_mode=None, return_hidden_states_before_norm=False)


@contextlib.contextmanager
def draft_model_context(parallel_layout):
    """What EAGLEWorkerV2 enters around every draft-model forward (eagle_worker_v2.py:1473)."""
    from sglang.srt.layers.moe.utils import (
        speculative_moe_a2a_backend_context,
        speculative_moe_backend_context,
    )
    from sglang.srt.speculative.spec_utils import draft_tp_context

    with (
        draft_tp_context(parallel_layout),
        speculative_moe_backend_context(),
        speculative_moe_a2a_backend_context(),
    ):
        yield


@contextlib.contextmanager
def _forward_replaced(model_runner, wrap):
    """`model_runner.forward` replaced by `wrap(forward)` inside the block; the runner's own
    `forward` (an instance attribute, or the class method) is back when the block ends.

    A change to what SGLang's draft loop does: each use is a "scoped" entry of the host-change
    ledger (host/changes.py), with its reason and upstream diff."""
    forward, own = model_runner.forward, "forward" in vars(model_runner)
    model_runner.forward = wrap(forward)
    try:
        yield
    finally:
        if own:
            model_runner.forward = forward
        else:
            del model_runner.forward


@contextlib.contextmanager
def kept_forward_logits(model_runner):
    """The `logits_output` of every `model_runner.forward` call inside the block, in a list
    (host change keep-draft-extend-logits).

    SGLang's draft-extend (eagle_worker_v2.py:1207-1272) keeps its logits local: for a top-1
    chain it takes the argmax and leaves `topk_p = 1.0` (a chain needs no scores), so the draft
    model's confidence is lost. Its eager path replaces `next_token_logits` on the same object
    with the rows it selected (:1233), so the object kept here holds one row per request
    after the call.
    """
    kept = []

    def wrap(forward):
        def keep(*args, **kwargs):
            out = forward(*args, **kwargs)
            kept.append(out.logits_output)
            return out

        return keep

    with _forward_replaced(model_runner, wrap):
        yield kept


@contextlib.contextmanager
def stoppable_forwards(model_runner, go_on, seen):
    """`model_runner.forward` inside the block: `seen(next_token_logits)` after every call
    that runs; before every call after the first, `go_on()`, and once that says no, this
    call and every later one return the last run's output again, without a forward (host
    change stop-draft-chain-early).

    SGLang's draft loop (eagle_worker_v2.py:816-897) runs every step of the chain and has no
    way to stop; the tokens it takes from a repeated output lie past where the chain stops,
    and are cut before verify.
    """
    last, stopped = None, False

    def wrap(forward):
        def step(*args, **kwargs):
            nonlocal last, stopped
            if last is not None and (stopped or not go_on()):
                stopped = True
                return last
            last = forward(*args, **kwargs)
            seen(last.logits_output.next_token_logits)
            return last

        return step

    with _forward_replaced(model_runner, wrap):
        yield


def clamp_draft_input_ids(draft_runner, size: int) -> None:
    """Make the draft model's embedding read ids at or past `size` as id `size - 1`.

    A draft whose vocabulary is a prefix of the target's is fed the target's committed tokens,
    which may lie past its rows; SGLang's VocabParallelEmbedding does not mask them at TP 1
    (vocab_parallel_embedding.py:516), so the gather would read out of bounds. The draft then
    drafts from a stand-in token, and verify rejects what it gets wrong: output is unchanged."""
    embedding = draft_runner.model.get_input_embeddings()
    last = size - 1

    def clamp(module, args):
        return (args[0].clamp(max=last), *args[1:])

    embedding.register_forward_pre_hook(clamp)
