"""Property-based fuzzing: parsing, routing and merging return normal results on any string."""

from __future__ import annotations

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_specsot.sot import (
    DIRECT,
    ERROR,
    PLAN,
    SoTConfig,
    merge_answer,
    parse_route_reply,
    parse_skeleton,
    plan_branches,
    route_question,
)
from sglang_specsot.sot.tag import SoTTag
from sglang_specsot.sot.text import classify_line, point_key

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_MARKERS = st.sampled_from(
    ["", "1.", "2)", "(3)", "Step 4:", "- ", "* ", "\u2022", "####", "**5.**", "  6.", "\t7.", "1."]
)
_WORDS = st.one_of(
    st.sampled_from(["Set goals", "Sleep", "Sleep.", "**Bold**: rest", "Title(120):...", "", " "]),
    st.from_regex(r"[A-Za-z][A-Za-z .:,()0-9*-]{0,60}", fullmatch=True),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40),
)


@st.composite
def list_like(draw) -> str:
    """Text shaped like a skeleton: marker + words per line, with the odd junk line."""
    lines = draw(st.lists(st.tuples(_MARKERS, _WORDS), min_size=1, max_size=70))
    sep = draw(st.sampled_from(["\n", "\r\n", "\n\n", " "]))
    return sep.join(f"{m} {w}" if m else w for m, w in lines)


_CONFIGS = st.builds(
    SoTConfig,
    min_points=st.integers(2, 4),
    max_points=st.integers(4, 12),
    max_point_words=st.integers(1, 15),
    max_point_chars=st.integers(1, 150),
    long_point_policy=st.sampled_from(["truncate", "flag"]),
)


def _check_invariants(parse, config: SoTConfig) -> None:
    assert parse.outcome in (PLAN, DIRECT, ERROR)
    assert isinstance(parse.reason, str) and parse.reason
    if parse.outcome != PLAN:
        assert parse.points == ()
        return
    assert config.min_points <= len(parse.points) <= config.max_points
    keys = [point_key(p.text) for p in parse.points]
    assert all(keys), "every point has words"
    assert len(set(keys)) == len(keys), "no duplicate points"
    for point in parse.points:
        assert point.text == point.text.strip() and "\n" not in point.text
        assert point.predicted_tokens is None or point.predicted_tokens >= 0
        if config.long_point_policy == "truncate":
            assert len(point.text.split()) <= config.max_point_words
            assert len(point.text) <= config.max_point_chars
    assert all(0 <= i < len(parse.points) for i in parse.long_points)


@FUZZ
@given(text=st.text(), prefill=st.sampled_from(["1.", ""]))
def test_any_string_parses_without_exception(text, prefill):
    _check_invariants(parse_skeleton(text, prefill=prefill), SoTConfig())


@FUZZ
@given(text=list_like(), config=_CONFIGS)
def test_list_shaped_text_keeps_invariants(text, config):
    parse = parse_skeleton(text, config)
    _check_invariants(parse, config)
    if parse.outcome == PLAN:  # and every plan can be planned and merged
        plan = plan_branches(parse, config)
        merged = merge_answer(plan.points, {b.index: text for b in plan.branches})
        assert len(merged.points) == len(plan.points)


@FUZZ
@given(question=st.text(), reply=st.one_of(st.none(), st.text()))
def test_router_never_raises(question, reply):
    decision = route_question(question, model_reply=reply)
    assert isinstance(decision.use_sot, bool) and decision.rule and decision.reason
    verdict = parse_route_reply(reply) if reply is not None else None
    assert verdict is None or verdict.source == "model"


@FUZZ
@given(
    points=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=8),
    texts=st.lists(st.one_of(st.text(), list_like()), max_size=8),
)
def test_merge_keeps_point_order_on_any_text(points, texts):
    expansions = {i: t for i, t in enumerate(texts[: len(points)])}
    merged = merge_answer(points, expansions)
    assert [p.index for p in merged.points] == list(range(len(points)))
    assert [p.point for p in merged.points] == points
    for p in merged.points:  # prose, and the branch's own lists as bullets: no line is a point
        first, *rest = p.expansion.split("\n")
        assert p.expansion == p.expansion.strip() and (first or not rest)
        for line in rest:
            assert line.strip() and (line.startswith("   - ") or classify_line(line, 0) is None), line


# Hang guards, not speed targets: a catastrophic regex backtrack on these inputs would run for
# hours; the generous per-test timeout turns that into a failure without timing anything.
@pytest.mark.timeout(120)
def test_huge_input_terminates():
    text = (" Sleep\n2. Eat well " + "x" * 50 + "\n") * 50_000 + " " * 200_000 + "1."
    parse = parse_skeleton(text)
    assert parse.outcome == ERROR and "repeats" in parse.reason  # 50,000 copies of two points


@pytest.mark.timeout(120)
def test_pathological_whitespace_terminates():
    text = "1." + " " * 100_000 + "\n" + "#" * 50_000 + "**" * 10_000
    assert parse_skeleton(text, prefill="").outcome in (PLAN, DIRECT, ERROR)
    assert route_question(text).use_sot in (True, False)
    assert merge_answer(["Sleep"], {0: text}).points[0].point == "Sleep"


# -- the skeleton parser on any config, and the SoT tag parser on any JSON ----------------------

_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)
_TAG_FIELDS = st.fixed_dictionaries(
    {},
    optional={"role": st.one_of(st.sampled_from(["plain", "skeleton", "branch"]), _JSON),
              "group": st.one_of(st.text(max_size=80), _JSON),
              "point": st.one_of(st.integers(-3, 70), _JSON), "n": st.one_of(st.integers(-3, 70), _JSON)},
)  # fmt: skip


@FUZZ
@given(text=st.one_of(st.text(), list_like()), config=_CONFIGS, truncated=st.booleans(),
       prefill=st.sampled_from(["1.", ""]))  # fmt: skip
def test_any_text_parses_under_any_config(text, config, truncated, prefill):
    _check_invariants(parse_skeleton(text, config, prefill=prefill, truncated=truncated), config)


@FUZZ
@given(custom_params=st.one_of(_JSON, st.fixed_dictionaries({"specsot": st.one_of(_TAG_FIELDS, _JSON)})))
def test_the_tag_parser_returns_a_tag_or_a_problem_on_any_json(custom_params):
    tag, problem = SoTTag.parse(custom_params)
    assert isinstance(tag, SoTTag)
    assert problem is None or (isinstance(problem, str) and problem and tag == SoTTag())
    if problem is None and tag != SoTTag():  # a well-formed tag round-trips
        assert SoTTag.parse(tag.to_custom_params()) == (tag, None)


@FUZZ
@given(fields=_TAG_FIELDS)
def test_a_tag_is_built_or_refused_with_a_value_error(fields):
    try:
        tag = SoTTag(fields.get("group"), fields.get("role", "plain"), fields.get("point"), fields.get("n"))
    except ValueError as exc:
        assert str(exc).startswith("invalid SoT tag: ")
    else:
        assert SoTTag.parse(tag.to_custom_params())[1] is None
