"""Table-driven skeleton parsing on outputs written the way SmolLM2 / Qwen2.5 really answer.

Unless a case says otherwise, the text is the model's continuation after the pre-filled
"1." of the skeleton prompt, exactly as the server returns it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sglang_specsot.sot import DIRECT, ERROR, PLAN, SoTConfig, parse_skeleton


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    outcome: str
    points: tuple[str, ...] = ()
    predicted: tuple[int | None, ...] | None = None
    prefill: str = "1."
    config: SoTConfig = SoTConfig()
    list_format: str | None = None


SIXTY = " Topic 1 idea\n" + "".join(f"{k}. Topic {k} idea\n" for k in range(2, 61))

CASES = [
    Case(
        "plain-continuation",
        " Set clear goals\n2. Prioritize important tasks\n3. Use a calendar\n4. Avoid multitasking",
        PLAN,
        ("Set clear goals", "Prioritize important tasks", "Use a calendar", "Avoid multitasking"),
        list_format="numbered",
    ),
    Case(
        "model-repeats-the-prefilled-1",
        "1. Exercise regularly\n2. Get enough sleep\n3. Practice mindfulness",
        PLAN,
        ("Exercise regularly", "Get enough sleep", "Practice mindfulness"),
    ),
    Case(
        "repeated-1-after-space",
        " 1. Syntax and readability\n2. Typing systems\n3. Runtime environments",
        PLAN,
        ("Syntax and readability", "Typing systems", "Runtime environments"),
    ),
    Case(
        "paren-numbers",
        " Exercise regularly\n2) Get enough sleep\n3) Talk to someone",
        PLAN,
        ("Exercise regularly", "Get enough sleep", "Talk to someone"),
    ),
    Case(
        "step-n-colon",
        " Step 1: Understand the problem\nStep 2: Gather information\nStep 3: Weigh the evidence",
        PLAN,
        ("Understand the problem", "Gather information", "Weigh the evidence"),
    ),
    Case(
        "bullets-without-prefill",
        "- Dynamic typing\n- Indentation rules\n- Browser support\n",
        PLAN,
        ("Dynamic typing", "Indentation rules", "Browser support"),
        prefill="",
        list_format="bulleted",
    ),
    Case(
        "unicode-bullets",
        "\u2022 Amino acid profile\n\u2022 Digestibility\n\u2022 Environmental cost",
        PLAN,
        ("Amino acid profile", "Digestibility", "Environmental cost"),
        prefill="",
    ),
    Case(
        "preamble-then-bullets",
        " Here are the main points:\n- Syntax differences\n- Typing systems\n- Use cases",
        PLAN,
        ("Syntax differences", "Typing systems", "Use cases"),
    ),
    Case(
        "research-hash-form",
        "####Introduction to CRISPR(120):...\n####Medical applications(250):...\n"
        "####Ethical concerns(200):...\n####%%%%",
        PLAN,
        ("Introduction to CRISPR", "Medical applications", "Ethical concerns"),
        predicted=(120, 250, 200),
        prefill="",
        list_format="hash",
    ),
    Case(
        "hash-form-with-prefill-and-content",
        "####Background(80): Quantum computers use qubits.\n####Superposition(150):...\n"
        "####Entanglement(150):...\n####%%%%\nQuantum computing is a new field.",
        PLAN,
        ("Background", "Superposition", "Entanglement"),
        predicted=(80, 150, 150),
    ),
    Case(
        "numbered-with-lengths",
        " Background(100):\n2. Main ideas(200):\n3. Summary",
        PLAN,
        ("Background", "Main ideas", "Summary"),
        predicted=(100, 200, None),
    ),
    Case(
        "trailing-prose",
        " Make a to-do list\n2. Set deadlines\n3. Limit distractions\n\nBy following these "
        "steps, you can manage your time better and reduce stress.",
        PLAN,
        ("Make a to-do list", "Set deadlines", "Limit distractions"),
    ),
    Case(
        "one-duplicate-dropped",
        " Regular exercise\n2. Healthy diet\n3. Regular exercise.\n4. Enough sleep",
        PLAN,
        ("Regular exercise", "Healthy diet", "Enough sleep"),
    ),
    Case(
        "two-duplicates-are-a-loop",
        " Regular exercise\n2. Healthy diet\n3. Regular exercise.\n4. Enough sleep\n"
        "5. healthy Diet",
        ERROR,
    ),
    Case("code-fence", " Bubble sort\n```cpp\nvoid sort(int* a) {\n", ERROR),
    Case("code-statement", " Read the file\n2. std::ifstream in(path);\n3. Count words", ERROR),
    Case("semicolon-prose-is-no-code", " Eat well;\n2. Sleep enough;\n3. Move daily",
         PLAN, ("Eat well", "Sleep enough", "Move daily")),
    Case(
        "missing-numbers",
        " Plan ahead\n3. Delegate work\n5. Review progress",
        PLAN,
        ("Plan ahead", "Delegate work", "Review progress"),
    ),
    Case(
        "out-of-order-numbers",
        " Plan the week\n3. Delegate small tasks\n2. Review each evening",
        PLAN,
        ("Plan the week", "Delegate small tasks", "Review each evening"),
    ),
    Case(
        "every-item-numbered-1",
        " Save money\n1. Cook at home\n1. Cancel subscriptions",
        PLAN,
        ("Save money", "Cook at home", "Cancel subscriptions"),
    ),
    Case(
        "long-point-truncated-at-colon",
        " Set clear goals: write down what you want to achieve each week and review them "
        "every Sunday evening\n2. Prioritize tasks\n3. Take breaks",
        PLAN,
        ("Set clear goals", "Prioritize tasks", "Take breaks"),
    ),
    Case(
        "long-point-cut-to-word-limit",
        " Try to make sure that you always get up at the same time every single morning "
        "including weekends and holidays\n2. Eat breakfast",
        PLAN,
        ("Try to make sure that you always get up at the same", "Eat breakfast"),
    ),
    Case(
        "long-point-flagged",
        " Set clear goals: write down what you want to achieve each week and review them "
        "every Sunday\n2. Prioritize tasks",
        PLAN,
        (
            "Set clear goals: write down what you want to achieve each week and review "
            "them every Sunday",
            "Prioritize tasks",
        ),
        config=SoTConfig(long_point_policy="flag"),
    ),
    Case(
        "empty-points-dropped",
        " \n2. Sleep well\n3. \n4. Eat well",
        PLAN,
        ("Sleep well", "Eat well"),
    ),
    Case("one-point-only", " Practice mindfulness daily.", DIRECT),
    Case(
        "one-numbered-point-then-prose",
        " Quantum computing\nQuantum computing uses qubits, which can be 0 and 1 at once.",
        DIRECT,
    ),
    Case(
        "sixty-points-capped",
        SIXTY,
        PLAN,
        tuple(f"Topic {k} idea" for k in range(1, 11)),
    ),
    Case(
        "prose-instead-of-list",
        " Time management is a skill that helps you use your time well. You can improve it "
        "by planning your day, setting priorities and avoiding distractions.",
        DIRECT,
    ),
    Case(
        "starts-with-a-number-in-prose",
        " There are 3 main reasons people procrastinate: fear of failure, boredom and poor "
        "planning. Each of them can be fixed.",
        DIRECT,
    ),
    Case(
        "repeated-skeleton-loop",
        " Syntax\n2. Typing\n3. Performance\n1. Syntax\n2. Typing\n3. Performance\n1. Syntax\n2.",
        PLAN,
        ("Syntax", "Typing", "Performance"),
    ),
    Case(
        "skeleton-then-starts-answering",
        " Exercise\n2. Sleep\n3. Diet\n\n1. Exercise: Physical activity releases endorphins, "
        "which improve mood.\n2. Sleep: Adults need 7-9 hours.",
        PLAN,
        ("Exercise", "Sleep", "Diet"),
    ),
    Case(
        "markdown-bold-titles",
        " **Set clear goals**: Know what you want.\n2. **Prioritize**: Do important things "
        "first.\n3. **Avoid distractions**: Turn off notifications.",
        PLAN,
        ("Set clear goals", "Prioritize", "Avoid distractions"),
    ),
    Case(
        "bold-numbers",
        "**1.** Sleep well\n**2.** Eat well\n**3.** Move daily",
        PLAN,
        ("Sleep well", "Eat well", "Move daily"),
        prefill="",
    ),
    Case(
        "whole-line-bold",
        "**1. Research the market**\n**2. Build a prototype**",
        PLAN,
        ("Research the market", "Build a prototype"),
        prefill="",
    ),
    Case(
        "markdown-headings-numbered",
        "### 1. Syntax\nPython uses indentation.\n### 2. Typing\nJavaScript is loosely typed.",
        PLAN,
        ("Syntax", "Typing"),
        prefill="",
    ),
    Case(
        "headings-without-numbers",
        "## Economic effects\n## Cultural effects\n## Political effects",
        PLAN,
        ("Economic effects", "Cultural effects", "Political effects"),
        prefill="",
        list_format="hash",
    ),
    Case(
        "nested-sub-bullets",
        " Physical health:\n   - Exercise\n   - Sleep\n2. Mental health:\n   - Meditation\n"
        "3. Social health",
        PLAN,
        ("Physical health", "Mental health", "Social health"),
    ),
    Case(
        "nested-numbered",
        "1. Health\n   1. Sleep\n   2. Diet\n2. Work\n3. Family",
        PLAN,
        ("Health", "Work", "Family"),
        prefill="",
    ),
    Case(
        "indented-after-prefill",
        " Define the problem\n   2. Gather facts\n   3. Weigh options",
        PLAN,
        ("Define the problem", "Gather facts", "Weigh options"),
    ),
    Case(
        "inline-list-one-line",
        " Set goals 2. Prioritize tasks 3. Avoid distractions",
        PLAN,
        ("Set goals", "Prioritize tasks", "Avoid distractions"),
        list_format="inline",
    ),
    Case(
        "sure-here-is-preamble",
        " Sure! Here is a skeleton for your question:\n1. Understand qubits\n2. Superposition\n"
        "3. Entanglement",
        PLAN,
        ("Understand qubits", "Superposition", "Entanglement"),
    ),
    Case(
        "restated-question",
        " Question: How can I deal with stress?\nSkeleton:\n1. Exercise\n2. Breathe deeply\n"
        "3. Talk to friends",
        PLAN,
        ("Exercise", "Breathe deeply", "Talk to friends"),
    ),
    Case(
        "explanations-under-points",
        " Set goals\nGoals give you direction.\n2. Plan your day\nPlanning saves time.",
        PLAN,
        ("Set goals", "Plan your day"),
    ),
    Case(
        "decimals-are-not-markers",
        " Sleep 7.5 hours\n2. Drink 2.5 liters of water",
        PLAN,
        ("Sleep 7.5 hours", "Drink 2.5 liters of water"),
    ),
    Case(
        "special-token-and-crlf",
        " Exercise\r\n2. Sleep<|im_end|>\r\n",
        PLAN,
        ("Exercise", "Sleep"),
    ),
    Case(
        "tab-indented",
        "\t1. Reduce waste\n\t2. Save energy\n\t3. Reuse bottles",
        PLAN,
        ("Reduce waste", "Save energy", "Reuse bottles"),
        prefill="",
    ),
    Case(
        "quoted-points",
        ' "Local knowledge"\n2. "Crowd composition"\n3. "Menu language"',
        PLAN,
        ("Local knowledge", "Crowd composition", "Menu language"),
    ),
    Case(
        "min-points-three",
        " Exercise\n2. Sleep",
        DIRECT,
        config=SoTConfig(min_points=3),
    ),
    Case(
        "stray-dot-after-prefill",
        ". Set goals\n2. Track progress",
        PLAN,
        ("Set goals", "Track progress"),
    ),
    Case(
        "points-that-look-like-labels",
        " Plan\n2. Do\n3. Check\n4. Act",
        PLAN,
        ("Plan", "Do", "Check", "Act"),
    ),
    Case(
        "answer-colon-lead-in",
        " Answer:\n1. Know your audience\n2. Practice aloud",
        PLAN,
        ("Know your audience", "Practice aloud"),
    ),
    Case("empty-output", "", ERROR),
    Case("whitespace-only", " \n\n  \t", ERROR),
    Case("numbers-only", " 1. 1. 1. 1.", ERROR),
    Case("symbols-only", "!!!!???...***", ERROR),
    Case("emoji-spam", "\U0001f642\U0001f642\U0001f642 \U0001f642\U0001f642", ERROR),
    Case("word-loop", " the the the the the the the the the the the the", ERROR),
    Case("one-point-repeated", " Exercise\n2. Exercise\n3. Exercise\n4. Exercise", ERROR),
    Case("hash-terminator-only", "####%%%%", ERROR, prefill=""),
]


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_parse_skeleton(case: Case):
    parse = parse_skeleton(case.text, case.config, prefill=case.prefill)
    assert parse.outcome == case.outcome, parse
    assert parse.texts == case.points, parse
    if case.predicted is not None:
        assert tuple(p.predicted_tokens for p in parse.points) == case.predicted
    if case.list_format is not None:
        assert parse.list_format == case.list_format


def test_sixty_points_note_the_cap():
    parse = parse_skeleton(SIXTY)
    assert any("first 10 of 60" in note for note in parse.notes)


def test_flag_policy_lists_long_point_indices():
    text = " Prioritize tasks\n2. " + " ".join(["word"] * 20 + ["end"]) + "\n3. Rest"
    parse = parse_skeleton(text, SoTConfig(long_point_policy="flag"))
    assert parse.long_points == (1,)
    assert parse_skeleton(text).long_points == ()  # truncation leaves nothing to flag


def test_duplicates_are_reported_in_notes():
    parse = parse_skeleton(" Diet\n2. Sleep\n3. Diet")
    assert parse.texts == ("Diet", "Sleep")
    assert any("duplicate" in note for note in parse.notes)


def test_non_string_is_an_error_not_an_exception():
    parse = parse_skeleton(None)  # type: ignore[arg-type]
    assert parse.outcome == ERROR and parse.points == ()
