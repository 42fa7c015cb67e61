"""Merging points and branch texts: echo stripping, run-on cutting, order, empty branches."""

from __future__ import annotations

import pytest

from sglang_specsot.sot import clean_expansion, merge_answer
from sglang_specsot.sot.merge import drop_cut_sentence, drop_lead_in

POINTS = ["Set clear goals", "Prioritize tasks", "Take breaks"]


@pytest.mark.parametrize(
    "raw, index, expected, repaired",
    [
        ("Goals give your day a direction.", 0, "Goals give your day a direction.", False),
        ("1. Set clear goals: Goals give direction.", 0, "Goals give direction.", True),
        ("**Set clear goals**\nGoals give direction.", 0, "Goals give direction.", True),
        ("Set Clear Goals - goals give direction.", 0, "goals give direction.", True),
        ("2. Start with what matters most.", 1, "Start with what matters most.", True),
        ("### Take breaks\nRest restores focus.", 2, "Rest restores focus.", True),
        ("Point 1: Set clear goals. Write them down.", 0, "Write them down.", True),
        (
            "Goals give direction.\n2. Prioritize tasks\nDo the hardest first.",
            0,
            "Goals give direction.",
            True,
        ),
        ("Goals matter. 2. Prioritize tasks: do hard things first.", 0, "Goals matter.", True),
        ("Goals matter.\n\n**Prioritize tasks**: do it.", 0, "Goals matter.", True),
        ("Goals matter.\n#### Take breaks(50):...", 0, "Goals matter.", True),
        ("Short breaks help.<|im_end|>", 2, "Short breaks help.", False),
        ("  Breaks\n  restore   focus. \n", 2, "Breaks restore focus.", False),
        ("Set clear goals", 0, "", True),  # only the echo: nothing usable
        ("You need 2. things: rest and food.", 2, "You need 2. things: rest and food.", False),
    ],
)
def test_clean_expansion(raw, index, expected, repaired):
    text, repairs = clean_expansion(raw, index, POINTS)
    assert text == expected
    assert bool(repairs) is repaired, repairs


def test_merge_keeps_skeleton_order_whatever_the_finish_order():
    # Dict order is the order the branches finished in: last point first.
    finish_order = {2: "Rest restores focus.", 0: "Goals give direction."}
    finish_order[1] = "Do the hardest first."
    answer = merge_answer(POINTS, finish_order)
    assert answer.text == (
        "1. **Set clear goals**: Goals give direction.\n"
        "2. **Prioritize tasks**: Do the hardest first.\n"
        "3. **Take breaks**: Rest restores focus."
    )
    assert [p.index for p in answer.points] == [0, 1, 2]
    assert answer.empty_points == ()


def test_the_text_written_after_the_lead_in_follows_the_bold_title_apart_from_it():
    # A branch writes after its pre-filled "**Title**:" (prompts.title_lead_in): whatever its text
    # starts with, the title stays apart from it (one space after the colon), never run into its
    # first sentence; a retried branch (nothing pre-filled) that echoes its title loses the echo.
    expansions = {0: " by writing them down.", 1: "  Hardest first.", 2: "**Take breaks**: Rest helps."}
    answer = merge_answer(POINTS, expansions)
    assert answer.text.splitlines() == [
        "1. **Set clear goals**: by writing them down.",
        "2. **Prioritize tasks**: Hardest first.",
        "3. **Take breaks**: Rest helps.",
    ]
    assert answer.points[2].repairs == ("stripped echoed header",)


@pytest.mark.parametrize(("title", "body", "line"), [
    ("Nationalism", "is a feeling of pride.", "1. **Nationalism** is a feeling of pride."),  # the title is its subject
    ("Shared goals", "are essential.", "1. **Shared goals** are essential."),
    ("Sleep", "helps the body repair.", "1. **Sleep** helps the body repair."),  # one word: a noun
    ("Take breaks", "are crucial.", "1. **Take breaks**: are crucial."),  # an instruction: no join mends it
    ("Nationalism", "Is it dangerous? Often.", "1. **Nationalism**: Is it dangerous? Often."),  # a new sentence
    ("Nationalism", "pride in a nation.", "1. **Nationalism**: pride in a nation."),  # no verb: a definition
])  # fmt: skip
def test_a_body_that_continues_its_title_as_the_subject_loses_the_colon(title, body, line):
    assert merge_answer([title], {0: body}).text == line


def test_missing_and_empty_branches_leave_the_bare_point():
    answer = merge_answer(POINTS, {1: "   ", 2: "Rest helps."})
    # A point with no body keeps its bold title alone, without the lead-in's colon.
    assert answer.text.splitlines() == ["1. **Set clear goals**", "2. **Prioritize tasks**", "3. **Take breaks**: Rest helps."]
    assert answer.empty_points == (0, 1)


def test_a_title_ending_in_a_question_or_exclamation_mark_keeps_it_and_gets_no_colon():
    answer = merge_answer(["Why rest?", "Sleep.", "Act now!", "Eat well;"],
                          {0: "It restores focus.", 1: "Eight hours.", 2: "Start today."})  # fmt: skip
    assert answer.text.splitlines() == [
        "1. **Why rest?** It restores focus.",
        "2. **Sleep**: Eight hours.",  # a trailing period or semicolon goes before the colon
        "3. **Act now!** Start today.",
        "4. **Eat well**",
    ]


def test_expansion_for_unknown_index_is_rejected():
    with pytest.raises(ValueError, match=r"indices \[5\] have no point"):
        merge_answer(POINTS, {5: "stray"})


def test_a_branch_that_lists_its_own_steps_keeps_them_as_bullets():
    points = ["Set clear goals", "Prioritize tasks"]
    text = ("Setting goals focuses your effort. Here are some steps:\n1. Write them down\n"
            "2. **Make them measurable**\n- Review weekly\n\n3. Prioritize tasks\nDo the urgent first.")  # fmt: skip
    merged = merge_answer(points, {0: text, 1: "Do the important first."})
    assert merged.points[0].expansion == (
        "Setting goals focuses your effort. Here are some steps:\n   - Write them down\n"
        "   - **Make them measurable**\n   - Review weekly"
    )
    assert "cut text that ran into another point" in merged.points[0].repairs
    assert merged.text.count("\n2. ") == 1  # the answer's own numbering is not disturbed


@pytest.mark.parametrize(
    ("text", "kept"),
    [("Plan ahead. Use a planner to", "Plan ahead."), ("Breathe! Then", "Breathe!"),
     ("Set goals (SMART). Write", "Set goals (SMART)."),
     # A lead-in whose list the budget cut goes with the list (the demo's "Here are the steps
     # you can follow:" ending a point), even when it is all there is: the point keeps its title.
     ("Make a schedule. Here are the steps you can follow:\n1. Write", "Make a schedule."),
     ("Make a schedule. Here are the steps:\n1. List tasks.\n2. Rank", "Make a schedule. Here are the steps:\n1. List tasks."),
     ("Rest well (daily). Try these:\n   - **Nap", "Rest well (daily)."), ("Steps:\n   - **Set", ""),
     # A closing bracket ends no sentence; one after a period does.
     ("Funding grew. For example, the National Institutes of Health (NIH) fund", "Funding grew."),
     ('He said "stop." Then', 'He said "stop."'), ("Rest. **Sleep well.** Then", "Rest. **Sleep well.**"),
     ("Use a tool. For example, e.g. the", "Use a tool."),
     # An open code block goes, and the lead-in that announced it.
     ("Python reads well. For example, this code:\n```python\ndef f(x):\n    return", "Python reads well."),
     ("Rest. Here:\n### Tips\n", "Rest."),
     # No sentence ended: the last clause of 8 words or more, closed; else nothing.
     ("Bubble sort steps through the list to be sorted and compares pairs, swapping them if they are in the wrong",
      "Bubble sort steps through the list to be sorted and compares pairs."),
     ("no sentence ended, so the point keeps its title", "")],
)  # fmt: skip
def test_a_budget_cut_loses_its_unfinished_sentence(text, kept):
    assert drop_cut_sentence(text) == kept


@pytest.mark.parametrize(
    ("text", "kept"),
    [("Rest restores focus. Here are some tips:", "Rest restores focus."),
     ("Rest restores focus. **Examples:**", "Rest restores focus."),
     ("Rest matters.\nHere are the key differences:\n- **Use Cases**:", "Rest matters."),
     ("Try these:", ""), ("Rest helps.\n## Tips", "Rest helps."),
     ("Try these:\n- **Nap**: twenty minutes.", "Try these:\n- **Nap**: twenty minutes."),
     ("Ratios such as 3:1 matter.", "Ratios such as 3:1 matter.")],
)  # fmt: skip
def test_a_lead_in_left_last_goes(text, kept):
    assert drop_lead_in(text) == kept


def test_a_list_that_ran_into_other_points_leaves_no_lead_in():
    # The branch of point 2 lists the skeleton's own points; the cut there left its lead-in last.
    raw = "Ranking saves time. Here are some strategies to prioritize tasks:\n\n1. **Set clear goals**: write them."
    text, repairs = clean_expansion(raw, 1, POINTS)
    assert text == "Ranking saves time."
    assert repairs == ("cut text that ran into another point", "dropped a lead-in left last")


def test_a_lead_in_with_one_item_folds_the_item_into_the_point():
    from sglang_specsot.sot.merge import fold_one_item_list

    cut = "Training is key. Here are some key points to consider:\n   - **Warm-up**: Before each workout, warm up."
    assert fold_one_item_list(cut) == "Training is key. Warm-up: Before each workout, warm up."
    two = "Intro:\n- a\n- b"
    assert fold_one_item_list(two) == two  # a list of two is a list
    trailing = "Steps:\n1. Plan the day.\nThen rest."
    assert fold_one_item_list(trailing) == trailing  # prose after the item: not a cut list
    merged = merge_answer(["Train regularly", "Rest"], {0: cut, 1: "Sleep well."})
    assert merged.text.splitlines()[0] == "1. **Train regularly**: Training is key. Warm-up: Before each workout, warm up."
    assert "folded a one-item list into its point" in merged.points[0].repairs


QUESTION = "How can I improve my time management skills?"


@pytest.mark.parametrize(("title", "body", "kept"), [
    # says nothing its title does not, and more follows: it goes, and the rest opens the point
    ("Prioritize tasks", "Prioritizing tasks is crucial for managing time effectively. It helps you focus.",
     "It helps you focus."),
    # the question's own words, restated
    ("Plan ahead", "Improving your time management is important. Write tomorrow's tasks tonight.",
     "Write tomorrow's tasks tonight."),
    # two words of its own and no "matters": kept
    ("Plan ahead", "Improving time management takes planning. Write tomorrow's tasks tonight.", None),
    # the only sentence stays: a point is never emptied
    ("Set realistic goals", "To improve your time management skills, set realistic goals.", None),
    # a reason is content: kept, though it opens by saying the title matters
    ("Get enough sleep", "Sleep is essential because growth hormone is released in deep sleep. Aim for eight hours.",
     None),
    # a list under the opener is no following sentence of its paragraph
    ("Use tools", "Using tools is important.\n- A calendar\n- A timer", None),
])  # fmt: skip
def test_an_opening_sentence_that_restates_goes_where_more_follows(title, body, kept):
    point = merge_answer([title], {0: body}, QUESTION).points[0]
    dropped = "dropped an opening sentence that restated the title or question" in point.repairs
    assert dropped is (kept is not None)
    if kept is None:
        assert point.expansion.startswith(body.split("\n")[0])
    else:
        assert point.expansion == kept


def test_without_the_question_only_the_title_is_restated():
    body = "Improving your time management is important. Write tomorrow's tasks tonight."
    assert merge_answer(["Plan ahead"], {0: body}).points[0].expansion == body


def test_an_opener_stays_where_the_next_sentence_leans_on_it_or_it_defines_the_title():
    body = "If every country used one currency, trade would be easier. This is because nobody converts money."
    assert merge_answer(["Trade would be easier"], {0: body}, "What if every country used the same currency?").points[0].expansion == body
    body = "The legislative branch is responsible for making laws. It has two chambers."
    assert merge_answer(["Legislative"], {0: body}, "What are the three branches of government?").points[0].expansion == body
