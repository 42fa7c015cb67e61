"""Whether a draft model speaks the target's token ids: the same vocabulary, or a prefix of it.

A checkpoint's `vocab_size` is its embedding's row count, often padded past its tokenizer:
Qwen2.5's tokenizer has 151,665 ids, its 0.5B pads them to 151,936 and its 7B to 152,064. A
draft whose rows are the first rows of the target's, on the same tokenizer, proposes only ids
the target has, and verify decides every one of them, so drafts stay lossless. What must
hold is that the ids both have mean the same tokens, and that the draft never proposes an id
the target lacks. Plain Python: the launcher checks sizes from config.json, the worker the
loaded tokenizers.
"""

from __future__ import annotations

from collections.abc import Mapping

FIX = "use a draft model with the target's tokenizer, or drop --speculative-draft-model-path to draft from the SoT context alone"
EXAMPLES = 3  # disagreeing tokens a message names


def size_problem(target_size: int, draft_size: int) -> str | None:
    """Why a draft of `draft_size` rows cannot draft for a target of `target_size` (None where
    it can): the draft may have fewer ids (a prefix of the target's), never more, since every
    id it proposes is fed to the target's embedding."""
    if draft_size <= target_size:
        return None
    return (
        f"its vocab_size is {draft_size} but the target's is {target_size}; a draft may have fewer "
        "ids than the target (a prefix of its vocabulary, as Qwen2.5-0.5B's 151936 of 7B's 152064), never more"
    )


def shared_id_disagreements(
    target_vocab: Mapping[str, int], draft_vocab: Mapping[str, int], shared: int
) -> list[tuple[int, str | None, str | None]]:
    """(id, target's token, draft's token) for ids below `shared` whose tokens differ, at most
    EXAMPLES of them: ids both models have must mean the same token to both tokenizers."""
    target, draft = _by_id(target_vocab, shared), _by_id(draft_vocab, shared)
    differ = sorted(i for i in target.keys() | draft.keys() if target.get(i) != draft.get(i))
    return [(i, target.get(i), draft.get(i)) for i in differ[:EXAMPLES]]


def _by_id(vocab: Mapping[str, int], below: int) -> dict[int, str]:
    return {i: token for token, i in vocab.items() if i < below}


def check_draft_vocabulary(path: str | None, target_size: int, draft_size: int, target_tok, draft_tok) -> None:
    """ValueError naming the flag, the sizes or the first disagreeing ids, and the fix, where
    the draft at `path` cannot draft for the target; tokenizers may be None (skip-tokenizer-init)."""
    flag = f"SPECSOT: --speculative-draft-model-path={path!r}"
    problem = size_problem(target_size, draft_size)
    if problem is not None:
        raise ValueError(f"{flag}: {problem}; {FIX}")
    if target_tok is None or draft_tok is None:
        return
    differ = shared_id_disagreements(target_tok.get_vocab(), draft_tok.get_vocab(), draft_size)
    if differ:
        named = ", ".join(f"id {i}: target {t!r}, draft {d!r}" for i, t, d in differ)
        raise ValueError(
            f"{flag} maps tokens to other ids than the target on the {draft_size} ids both have "
            f"(target vocab_size {target_size}; {named}); {FIX}"
        )
