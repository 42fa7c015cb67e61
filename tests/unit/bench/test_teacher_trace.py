"""teacher_trace: a draft's chain acceptance on recorded answers, without a model (pure parts)."""

from __future__ import annotations

import pytest

from sglang_specsot.bench.store import OK, CellResult
from sglang_specsot.bench.teacher_trace import chain_steps, sot_parts


def test_each_step_accepts_the_drafts_that_match_the_answer_then_commits_a_bonus():
    answer = [10, 11, 12, 13, 14, 15, 16, 17]
    # draft_next[i]: the draft's token after answer[: i + 1]; it misses answer[3] and answer[6].
    draft_next = [11, 12, 99, 14, 15, 98, 17]
    steps = chain_steps("r", answer, draft_next, k=4)
    # committed 1 -> drafts 11, 12 match, 99 misses: 2 accepted + bonus 13 -> committed 4
    # committed 4 -> drafts 14, 15 match, 98 misses: 2 accepted + bonus 16 -> committed 7
    # committed 7 -> no draft may take the last token (it is a bonus): 0 accepted, bonus 17
    assert [s.accepted for s in steps] == [2, 2, 0]
    assert sum(s.accepted + 1 for s in steps) == len(answer) - 1  # every token after prefill's
    assert all(s.parents == (-1, 0, 1, 2, 3) and s.width == 5 and s.node == s.accepted for s in steps)


def test_a_perfect_draft_is_held_to_the_chains_length():
    answer = list(range(12))
    steps = chain_steps("r", answer, answer[1:], k=4)
    assert [s.accepted for s in steps] == [4, 4, 0]  # the last token is the last step's bonus


def test_a_short_draft_sequence_is_refused():
    with pytest.raises(ValueError, match="draft_next has 1 tokens"):
        chain_steps("r", [1, 2, 3], [2], k=2)


def test_sot_parts_read_titles_and_bodies_of_the_merged_format():
    answer = ("1. **Use a planner**: Write the day down.\n   - morning\n2. **Why rest?** It restores focus.\n"
              "3. **Sleep**")
    titles, bodies = sot_parts(CellResult(1, "SoT-server", OK, True, answer=answer, path="sot"))
    assert titles == ["Use a planner", "Why rest?", "Sleep"]
    assert bodies == ["Write the day down.\n   - morning", "It restores focus.", ""]
