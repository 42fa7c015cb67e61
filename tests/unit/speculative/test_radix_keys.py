"""The tree cache of a SPECSOT server drafting with a draft model is keyed by token pairs
(speculative/radix_keys.py); every other server's is built as SGLang builds it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang_specsot.speculative import radix_keys
from sglang_specsot.speculative.draft_kind import DraftKind


def _build(algorithm: str | None, kind: DraftKind | None, monkeypatch, is_eagle=False, disable=False) -> bool:
    monkeypatch.setattr(radix_keys, "configured_draft_kind", lambda: kind)
    ctx = SimpleNamespace(
        server_args=SimpleNamespace(speculative_algorithm=algorithm),
        params=SimpleNamespace(is_eagle=is_eagle, disable=disable),
    )
    built = radix_keys.create_tree_cache_around(lambda c: c, ctx)
    assert built is ctx  # SGLang's factory is called with the builder's own context
    return ctx.params.is_eagle


def test_specsot_with_a_draft_model_gets_pair_keys(monkeypatch):
    assert _build("SPECSOT", DraftKind.MODEL, monkeypatch)


@pytest.mark.parametrize(
    "algorithm, kind",
    [("SPECSOT", None), ("STANDALONE", DraftKind.MODEL), (None, None), ("NGRAM", None)],
    ids=["specsot-context-only", "sglang-standalone", "plain", "ngram"],
)
def test_other_servers_keep_sglangs_keys(algorithm, kind, monkeypatch):
    assert not _build(algorithm, kind, monkeypatch)


def test_an_eagle_head_keeps_sglangs_pair_keys(monkeypatch):
    assert _build("SPECSOT", DraftKind.EAGLE3, monkeypatch, is_eagle=True)


def test_a_disabled_radix_cache_is_left_alone(monkeypatch):
    assert not _build("SPECSOT", DraftKind.MODEL, monkeypatch, disable=True)
