"""The SoT tag: what the SoT program writes into custom_params and the SPECSOT worker reads."""

from __future__ import annotations

import pytest

from sglang_specsot.sot.tag import BRANCH, PLAIN, PLAIN_TAG, SKELETON, SoTTag


@pytest.mark.parametrize(
    ("params", "tag"),
    [
        (None, PLAIN_TAG),
        ({}, PLAIN_TAG),
        ({"other": 1}, PLAIN_TAG),
        ({"specsot": {"role": "plain"}}, PLAIN_TAG),
        ({"specsot": {"role": "plain", "group": "g1"}}, PLAIN_TAG),  # a plain answer drafts alone
        ({"specsot": {"role": "skeleton", "group": "g1"}}, SoTTag("g1", SKELETON)),
        ({"specsot": {"role": "branch", "group": "g1", "point": 2, "n": 5}}, SoTTag("g1", BRANCH, 2, 5)),
    ],
)
def test_well_formed(params, tag):
    assert SoTTag.parse(params) == (tag, None)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("branch", "must be an object"),
        ({"role": "leaf", "group": "g"}, "role must be one of"),
        ({"role": "branch", "point": 0, "n": 2}, "needs a group"),
        ({"role": "skeleton", "group": ""}, "non-empty string"),
        ({"role": "skeleton", "group": 7}, "non-empty string"),
        ({"role": "branch", "group": "g" * 200, "point": 0, "n": 2}, "non-empty string"),
        ({"role": "branch", "group": "g", "point": 3, "n": 2}, "0 <= point < n"),
        ({"role": "branch", "group": "g", "point": 0, "n": 0}, "1 <= n <="),
        ({"role": "branch", "group": "g", "point": 0, "n": 65}, "1 <= n <="),
        ({"role": "branch", "group": "g", "point": "1", "n": 2}, "0 <= point < n"),
        ({"role": "branch", "group": "g", "point": True, "n": 2}, "0 <= point < n"),
    ],
)
def test_malformed_falls_back_to_plain_with_a_reason(raw, problem):
    tag, reason = SoTTag.parse({"specsot": raw})
    assert tag == PLAIN_TAG
    assert problem in reason


@pytest.mark.parametrize(
    "tag", [SoTTag(), SoTTag("g", PLAIN), SoTTag("g", SKELETON), SoTTag("g", BRANCH, 0, 1), SoTTag("g", BRANCH, 4, 5)]
)
def test_what_the_writer_writes_the_reader_reads(tag):
    expected = PLAIN_TAG if tag.role == PLAIN else tag
    assert SoTTag.parse(tag.to_custom_params()) == (expected, None)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("g", "leaf"), "role must be one of"),
        ((None, SKELETON), "needs a group"),
        (("g", SKELETON, 0, 3), "only a branch has point and n"),
        (("g", BRANCH), "1 <= n <="),
        (("g", BRANCH, 2, 2), "0 <= point < n"),
    ],
)
def test_the_writer_refuses_a_tag_the_reader_would_not_accept(args, problem):
    with pytest.raises(ValueError, match=problem):
        SoTTag(*args)


# -- fuzzing: whatever a client puts in custom_params, the reader returns a tag ---------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_TAGLIKE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["plain", "skeleton", "branch", "leaf", "", None, 1]) | _JSON,
        "group": st.text(max_size=140) | _JSON,
        "point": st.integers(-3, 70) | _JSON,
        "n": st.integers(-3, 70) | _JSON,
    },
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_JSON, st.fixed_dictionaries({"specsot": _TAGLIKE | _JSON})))
def test_any_custom_params_parse_to_a_tag_or_a_stated_problem(params):
    tag, problem = SoTTag.parse(params)
    assert isinstance(tag, SoTTag)
    if problem is not None:
        assert tag == PLAIN_TAG and isinstance(problem, str) and problem
    else:  # what the reader accepts, the writer can write again unchanged
        assert SoTTag.parse(tag.to_custom_params()) == (tag, None)
