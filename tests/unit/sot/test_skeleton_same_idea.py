"""The skeleton parser merges titles of one idea written in other words."""

from __future__ import annotations

from sglang_specsot.sot import parse_skeleton
from sglang_specsot.sot.skeleton import SkeletonPoint, merge_same_ideas


def test_a_title_repeating_an_earlier_one_in_other_words_is_merged_into_it():
    # q7 of the tuning questions (smartphones), greedy 1.5B: "Entertainment" and, last,
    # "Entertainment options": two branches wrote the same streaming services twice.
    text = " Communication\n2. Entertainment\n3. Productivity\n4. Health and wellness\n5. Social interaction\n6. Entertainment options"
    parse = parse_skeleton(text, prefill="1.")
    assert parse.texts == ("Communication", "Entertainment", "Productivity", "Health and wellness", "Social interaction")
    assert any("same idea as 'Entertainment'" in n for n in parse.notes)


def test_distinct_titles_sharing_a_word_or_differing_by_a_number_stay():
    text = " Check the SSL certificate\n2. Check the terms of service\n3. Step 1 of the audit\n4. Step 2 of the audit"
    assert len(parse_skeleton(text, prefill="1.").texts) == 4


def test_merging_stops_at_the_plans_minimum():
    points = [SkeletonPoint(t) for t in ("Cost", "Cost savings", "Lower costs")]
    kept, _, notes = merge_same_ideas(points, (), floor=2)
    assert [p.text for p in kept] == ["Cost", "Lower costs"] and len(notes) == 1
