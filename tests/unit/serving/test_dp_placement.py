"""Where an SoT answer's generations run on a server with several data-parallel ranks."""

from __future__ import annotations

import pytest

from sglang_specsot.serving import dp_placement
from sglang_specsot.serving.dp_placement import DP_BRANCHES_ENV, HomeRanks, Placement, placement_from_env


def test_one_rank_leaves_every_choice_to_sglang():
    placement = HomeRanks().place(1, "spread")
    assert placement.home is None and placement.branch_rank(3) is None
    assert placement.commit_ranks([0, 1, 2]) == [None]


def test_keep_runs_the_whole_answer_on_its_home_and_homes_take_turns():
    homes = HomeRanks()
    answers = [homes.place(2, "keep") for _ in range(3)]
    assert [a.home for a in answers] == [0, 1, 0]
    second = answers[1]
    assert [second.branch_rank(p) for p in range(4)] == [1, 1, 1, 1]
    assert second.commit_ranks([0, 1, 2, 3]) == [1]  # the prefix is prefilled once


def test_spread_deals_the_branches_from_the_home_and_commits_where_they_run():
    placement = Placement(home=1, ranks=3, spread=True)
    assert [placement.branch_rank(p) for p in range(5)] == [1, 2, 0, 1, 2]
    assert placement.commit_ranks([0, 1, 2]) == [1, 0, 2]  # the home first, then the others
    assert placement.commit_ranks([0]) == [1]  # one branch: only the rank that runs it


def test_a_clients_routed_dp_rank_keeps_the_answer_whole_there():
    placement = HomeRanks().place(4, "spread", client_rank=3)
    assert placement.home == 3 and {placement.branch_rank(p) for p in range(6)} == {3}


@pytest.mark.parametrize("value, chosen", [(None, "keep"), ("", "keep"), ("Spread", "spread"), (" keep ", "keep")])
def test_the_setting_reads_case_and_blanks_leniently(value, chosen):
    assert placement_from_env(value) == chosen


def test_an_unknown_setting_names_the_value_and_the_choices(monkeypatch):
    monkeypatch.setenv(DP_BRANCHES_ENV, "scatter")
    with pytest.raises(ValueError, match=r"SGLANG_SPECSOT_DP_BRANCHES='scatter'.*\['keep', 'spread'\]"):
        dp_placement.place_answer(2)


@pytest.mark.parametrize("ranks, rank", [(2, 2), (2, -1), (1, 1)])
def test_a_client_rank_the_server_lacks_is_refused_before_anything_runs(ranks, rank):
    with pytest.raises(ValueError, match=rf"routed_dp_rank={rank} out of range \[0, {max(ranks, 1)}\)"):
        HomeRanks().place(ranks, "keep", client_rank=rank)


def test_rank_zero_on_a_server_without_dp_is_left_to_sglang_which_ignores_it():
    assert HomeRanks().place(1, "keep", client_rank=0).home is None
