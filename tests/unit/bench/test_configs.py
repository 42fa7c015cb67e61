from __future__ import annotations

import pytest

from sglang_specsot.bench.configs import BASELINE, SERVER_SOT, matrix, select, servers


def test_matrix_with_a_draft_runs_spec_sot_on_the_draft_server():
    cells = {c.name: c for c in matrix(has_draft=True)}
    assert list(cells)[0] == BASELINE
    assert {"STANDALONE", "SPECSOT", "SPECSOT-ctx", "NGRAM", "SoT-frontend", "SoT+NGRAM"} <= set(cells)
    assert cells["SpecSoT-server"].server == "specsot" and cells["SpecSoT-server"].kind == SERVER_SOT
    ctx = cells["SpecSoT-ctx-server"]  # SoT on the context-alone server, beside the draft's
    assert (ctx.server, ctx.kind, ctx.mode) == ("specsot-ctx", SERVER_SOT, "on")
    router = cells["SpecSoT-router"]
    assert router.mode == "auto" and router.runs_on(False) and not router.runs_on(True)
    auto = cells["SoT-auto"]  # the latency model's route, on every question of the plain server
    assert (auto.server, auto.kind, auto.mode) == ("plain", SERVER_SOT, "auto")
    assert auto.runs_on(True) and auto.runs_on(False)


def test_matrix_without_a_draft_has_no_draft_servers():
    cells = matrix(has_draft=False)
    assert {c.server for c in cells} <= set(servers(None))
    assert not {"STANDALONE", "SpecSoT-ctx-server"} & {c.name for c in cells}  # SpecSoT-server is the ctx one
    assert next(c for c in cells if c.name == "SpecSoT-server").server == "specsot-ctx"


def test_draft_servers_share_one_chain():
    specs = servers("/models/draft", steps=4)
    assert "/models/draft" in specs["standalone"].args and "/models/draft" in specs["specsot"].args

    def flag(name: str, server: str) -> str:
        args = specs[server].args
        return args[args.index(name) + 1]

    assert flag("--speculative-num-draft-tokens", "specsot") == "8"
    assert flag("--speculative-num-draft-tokens", "standalone") == "5"


def test_a_token_map_reaches_specsots_draft_only():
    specs = servers("/models/draft", token_map="/maps/hot.pt")
    args = list(specs["specsot"].args)
    assert args[args.index("--speculative-token-map") + 1] == "/maps/hot.pt"
    assert all("--speculative-token-map" not in s.args for name, s in specs.items() if name != "specsot")
    assert "--speculative-token-map" not in servers("/models/draft")["specsot"].args


def test_a_token_map_is_a_file_or_a_shipped_name(tmp_path):
    from sglang_specsot.speculative.token_map import resolve_map

    assert resolve_map("qwen2.5").endswith("qwen2.5-49k.pt")
    (tmp_path / "m.pt").write_bytes(b"")
    assert resolve_map(str(tmp_path / "m.pt")) == str((tmp_path / "m.pt").resolve())
    with pytest.raises(ValueError, match="--token-map 'nope' is not a file; no shipped token map 'nope'"):
        resolve_map("nope")


def test_specsot_servers_run_adaptive_draft_budgets():
    specs = servers("/models/draft")
    assert {name for name, s in specs.items() if "--speculative-adaptive" in s.args} == {"specsot", "specsot-ctx"}


def test_select_keeps_the_baseline_and_names_unknown_configurations():
    chosen = select(matrix(False), ["SpecSoT-server"])
    assert [c.name for c in chosen] == [BASELINE, "SpecSoT-server"]
    with pytest.raises(ValueError, match="STANDALONE.*known here"):
        select(matrix(False), ["STANDALONE"])


def test_an_eagle3_head_is_compared_with_sglangs_eagle3(tmp_path):
    import json

    from sglang_specsot.bench.configs import baseline_algorithm

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert baseline_algorithm(str(head)) == "EAGLE3"
    assert baseline_algorithm("qwen2.5-coder-0.5b") == baseline_algorithm(None) == "STANDALONE"
    specs = servers(str(head), steps=4)
    assert "standalone" not in specs and specs["eagle3"].algorithm == "EAGLE3"
    assert str(head) in specs["eagle3"].args and str(head) in specs["specsot"].args
    cells = {c.name: c for c in matrix(True, "EAGLE3")}
    assert cells["EAGLE3"].server == "eagle3" and "STANDALONE" not in cells
    sot = cells["SoT+EAGLE3"]  # SoT's branches over SGLang's own drafting with the same head
    assert (sot.server, sot.kind, sot.mode) == ("eagle3", SERVER_SOT, "on")
    assert {c.server for c in cells.values()} <= set(specs)


def test_a_traced_run_drafts_the_whole_window_and_records_each_specsot_server_apart(tmp_path):
    specs = servers("/models/draft", trace=str(tmp_path / "trace.jsonl"))
    for name in ("specsot", "specsot-ctx"):
        env = dict(specs[name].env)
        assert env["SGLANG_SPECSOT_TRACE"] == str(tmp_path / f"trace-{name}.jsonl")
        assert env["SGLANG_SPECSOT_FIXED_WINDOW"] == "1"
        # The adaptive flag would win over the fixed window (policy/config.py).
        assert "--speculative-adaptive" not in specs[name].args
    assert "SGLANG_SPECSOT_TRACE" not in dict(specs["plain"].env)
    assert "--speculative-adaptive" in servers("/models/draft")["specsot"].args
