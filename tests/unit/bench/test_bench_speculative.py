"""examples/bench_speculative.py: the parts that need no server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "examples" / "bench_speculative.py"
_spec = importlib.util.spec_from_file_location("bench_speculative", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_answers_are_compared_with_plain_decodings_for_the_same_prompt_and_round():
    plain = {(0, "a"): "x y", (0, "b"): "z", (1, "a"): "x y"}
    spec = {(0, "a"): "x y", (0, "b"): "z!", (1, "a"): "x y"}
    assert bench.same_as(spec, plain) == (2, 3)
    assert bench.same_as(plain, plain) == (3, 3)
    assert bench.same_as({(2, "a"): "x y"}, plain) == (0, 1)  # a round plain never answered


def test_fixed_twins_draft_their_whole_window_and_the_rest_do_not():
    names = bench.configs(None, 6, 4, 1, 5, fixed=True)
    assert set(names) == {"plain", "NGRAM", "SPECSOT-ctx", "SPECSOT-ctx-fixed"}
    assert names["SPECSOT-ctx-fixed"] == names["SPECSOT-ctx"]
    assert bench.server_env("SPECSOT-ctx-fixed") == {bench.FIXED_WINDOW_ENV: "1"}
    assert bench.server_env("SPECSOT-ctx") == {}


def test_bf16_draft_twins_only_for_configs_with_a_draft_model_and_keep_its_weights():
    names = bench.configs("/draft", 6, 4, 1, 5, adaptive=True, bf16_draft=True)
    twins = {n for n in names if n.endswith("-bf16")}
    assert twins == {"SPECSOT-bf16", "SPECSOT+ad-bf16"}  # SPECSOT-ctx has no draft model to keep
    assert names["SPECSOT-bf16"] == names["SPECSOT"]
    assert bench.server_env("SPECSOT-bf16") == {bench.DRAFT_INT8_ENV: "off"}
    assert bench.server_env("SPECSOT") == {}


def test_a_token_map_twin_cuts_only_specsots_draft_head():
    names = bench.configs("/draft", 6, 4, 1, 5, token_map="/map.pt")
    assert names["SPECSOT-hot"] == names["SPECSOT"] + ["--speculative-token-map", "/map.pt"]
    assert "SPECSOT-hot" not in bench.configs(None, 6, 4, 1, 5, token_map="/map.pt")  # no draft head to cut


def test_a_variant_runs_specsot_with_its_own_adaptive_keys(tmp_path):
    from sglang_specsot.speculative.policy.config import AdaptiveConfig

    variants = bench.parse_variants(['noru={"runner_ups": false}'], tmp_path, max_budget=7)
    names = bench.configs("/draft", 6, 4, 1, 5, variants=variants)
    extra = ["--speculative-adaptive", "--speculative-adaptive-config", variants["noru"]]
    assert names["SPECSOT-noru"] == names["SPECSOT"] + extra  # the file is read only with the flag
    # The file is SGLang's format with SPECSOT's default candidates, and SPECSOT reads it.
    config = AdaptiveConfig.from_json((tmp_path / "adaptive-noru.json").read_text(), max_budget=7)
    assert config.runner_ups is False and config.candidates(1) == tuple(range(8))
    # Its own budgets: [0] is a SPECSOT server that never drafts (its plain steps' own cost).
    variants = bench.parse_variants(['plainonly={"candidate_steps": [0]}'], tmp_path, max_budget=7)
    config = AdaptiveConfig.from_json((tmp_path / "adaptive-plainonly.json").read_text(), max_budget=7)
    assert config.candidates(1) == config.candidates(8) == (0,) and config.runner_ups is True
    for bad in ("noru", "no ru={}", "noru=[1]"):
        with pytest.raises(ValueError, match="--variant"):
            bench.parse_variants([bad], tmp_path, max_budget=7)


def test_every_config_is_reported_against_the_baseline(capsys):
    from types import SimpleNamespace

    def stats(tokens: int, seconds: float, texts: dict) -> dict:
        return {"tokens": tokens, "seconds": seconds, "accept": [3.0], "spent": [4.0], "depth": {}, "texts": texts,
                "rounds": {0: [tokens, seconds]}}

    # An A/B of two SPECSOT configs, no plain server: ratios and equal answers are the
    # baseline's, and the table says which config that is.
    runs = {("SPECSOT", "vicuna"): stats(300, 100.0, {(0, "a"): "x", (0, "b"): "y"}),
            ("SPECSOT-noru", "vicuna"): stats(200, 100.0, {(0, "a"): "x", (0, "b"): "z"})}  # fmt: skip
    args = SimpleNamespace(model="m", draft="d", steps=4, topk=1, questions=2, question_set="vicuna80", skip=0,
                           rounds=1, max_new_tokens=8, points=4, dtype="bfloat16", baseline="SPECSOT-noru")  # fmt: skip
    bench.report(runs, ["SPECSOT", "SPECSOT-noru"], ["vicuna"], args)
    out = capsys.readouterr().out
    assert "vs SPECSOT-noru" in out and "same as SPECSOT-noru" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("vicuna ")}
    assert rows["SPECSOT"][-3:] == ["1.50x", "-", "1/2"] and rows["SPECSOT-noru"][-3:] == ["1.00x", "-", "2/2"]


def test_questions_come_from_any_set_after_the_ones_earlier_runs_used():
    from sglang_specsot.data import load_questions

    suitable = [r["question"] for r in load_questions("vicuna80") if r["sot_suitable"]]
    assert bench.suitable_questions("vicuna80", 4) == suitable[:4]
    assert bench.suitable_questions("vicuna80", 8, skip=12) == suitable[12:20]
    path = str(Path(bench.__file__).parents[1] / "sglang_specsot" / "data" / "router_holdout2.jsonl")
    held_out = [r["question"] for r in load_questions(path) if r["sot_suitable"]]
    assert len(held_out) == 16 and bench.suitable_questions(path, 16) == held_out  # no math or code comes in
    for n, skip in ((0, 0), (4, -1), (len(suitable), 1)):
        with pytest.raises(ValueError, match=f"--skip {skip} --questions {n}: vicuna80 has {len(suitable)}"):
            bench.suitable_questions("vicuna80", n, skip)
    with pytest.raises(ValueError, match="unknown question set"):
        bench.suitable_questions("no-such-set", 1)


def test_a_code_twin_runs_each_specsot_config_from_another_source_tree(tmp_path):
    (tmp_path / "sglang_specsot").mkdir()
    code = bench.parse_code([f"base={tmp_path}"])
    names = bench.configs("/draft", 6, 4, 1, 5, code=code)
    assert {n for n in names if "@" in n} == {"SPECSOT-ctx@base", "SPECSOT@base"}
    assert names["SPECSOT@base"] == names["SPECSOT"]
    assert bench.server_env("SPECSOT@base", code) == {"PYTHONPATH": str(tmp_path.resolve())}
    assert bench.server_env("SPECSOT", code) == {}
    with pytest.raises(ValueError, match="--code 'base=/nowhere'.*git worktree"):
        bench.parse_code(["base=/nowhere"])


def test_the_configurations_take_turns_at_going_first():
    names = ["plain", "SPECSOT", "SPECSOT-ctx"]
    orders = [bench.rotated(names, turn) for turn in range(4)]
    assert orders[0] == names and orders[1] == ["SPECSOT", "SPECSOT-ctx", "plain"] and orders[3] == names
    assert all(sorted(o) == sorted(names) for o in orders)


def test_round_spread_is_the_range_of_the_rounds_ratios():
    base = {0: [100, 10.0], 1: [100, 20.0]}  # 10 and 5 tok/s
    mine = {0: [100, 12.5], 1: [100, 20.0]}  # 8 and 5 tok/s: 0.80x and 1.00x
    assert bench.round_spread(mine, base) == "0.80-1.00"
    assert bench.round_spread({0: [100, 10.0]}, base) == "-"  # one round has no spread


def test_the_sot_workload_asks_each_question_for_a_forced_sot_answer():
    class Tokenizer:
        @staticmethod
        def apply_chat_template(messages, tokenize, add_generation_prompt):
            return messages[0]["content"]

    loads = bench.workloads(Tokenizer(), ["Q1?", "Q2?"], points=2)
    assert loads["sot"] == [(["Q1?"], bench.SOT_ANSWER), (["Q2?"], bench.SOT_ANSWER)]
    assert bench.SOT_ANSWER["sot"] == {"mode": "on", "config": {"read_opening": False}}
    assert bench.server_env("plain", delay_sample=True) == {"SGLANG_ENABLE_DELAY_SAMPLE": "1"}
    assert bench.server_env("SPECSOT", delay_sample=True) == {}  # SPECSOT runs the constraint as it is


def test_a_sot_answer_is_measured_as_the_client_gets_it():
    class Server:
        def post(self, path, body):
            self.path, self.body = path, body
            return {"usage": {"completion_tokens": 42}, "choices": [{"message": {"content": "1. A"}}],
                    "metadata": {"specsot": {"path": "sot", "spec_accept_length": 1.5}}}

    server = Server()
    tokens, seconds, accept, texts = bench.run_batch(server, ["Q?"], bench.SOT_ANSWER, 128)
    assert server.path == "/v1/chat/completions" and server.body["max_tokens"] == 128
    assert server.body["specsot"] == bench.SOT_ANSWER["sot"] and server.body["temperature"] == 0
    assert (tokens, accept, texts) == (42, [(1.5, None)], ["1. A"]) and seconds >= 0


def test_servers_start_in_the_order_asked_the_rest_after():
    names = ["plain", "SPECSOT-ctx", "SPECSOT"]
    assert bench.start_order(names, None) == names
    assert bench.start_order(names, "SPECSOT") == ["SPECSOT", "plain", "SPECSOT-ctx"]
    assert bench.start_order(names, "SPECSOT,SPECSOT-ctx") == ["SPECSOT", "SPECSOT-ctx", "plain"]
    with pytest.raises(ValueError, match=r"--start-order names \['NGRAM'\]"):
        bench.start_order(names, "NGRAM")


def test_a_plain_twin_is_a_second_plain_server_reported_against_both_plains(capsys):
    from types import SimpleNamespace

    names = bench.configs(None, 6, 4, 1, 5, plain_twin=True)
    assert names[bench.PLAIN_TWIN] == names["plain"] == []
    assert bench.PLAIN_TWIN not in bench.configs(None, 6, 4, 1, 5)
    # By default the servers start in this order: plain first, its twin last, the rest between.
    order = bench.start_order(list(bench.configs("/draft", 6, 4, 1, 5, plain_twin=True)), None)
    assert order[0] == "plain" and order[-1] == bench.PLAIN_TWIN and "SPECSOT" in order[1:-1]
    # The twin samples as plain does (delayed under server-side SoT).
    assert bench.server_env(bench.PLAIN_TWIN, delay_sample=True) == bench.server_env("plain", delay_sample=True)

    def stats(tokens: int, seconds: float) -> dict:
        return {"tokens": tokens, "seconds": seconds, "accept": [], "spent": [], "depth": {}, "texts": {},
                "rounds": {0: [tokens, seconds]}}  # fmt: skip

    # plain 4 tok/s, its twin 1 tok/s: their geometric mean is 2, so a config at 2 tok/s is 1.00x.
    runs = {("plain", "vicuna"): stats(400, 100.0), (bench.PLAIN_TWIN, "vicuna"): stats(100, 100.0),
            ("SPECSOT-ctx", "vicuna"): stats(200, 100.0)}  # fmt: skip
    names = ["plain", bench.PLAIN_TWIN, "SPECSOT-ctx"]
    assert bench.against_both_plains(runs, names, "vicuna") == pytest.approx(
        {"plain": 2.0, bench.PLAIN_TWIN: 0.5, "SPECSOT-ctx": 1.0}
    )
    args = SimpleNamespace(model="m", draft=None, steps=4, topk=1, questions=1, question_set="vicuna80", skip=0,
                           rounds=1, max_new_tokens=8, points=4, dtype="bfloat16", baseline="plain")  # fmt: skip
    bench.report(runs, names, ["vicuna"], args)
    out = capsys.readouterr().out
    assert "vicuna     plain 2.00x, plain-2 0.50x, SPECSOT-ctx 1.00x" in out


def test_step_logs_go_to_each_specsot_server_alone(tmp_path):
    env = bench.server_env("SPECSOT-ctx", step_logs=tmp_path)
    assert env == {bench.STEP_LOG_ENV: str(tmp_path / "steps-SPECSOT-ctx.jsonl")}
    assert bench.server_env("SPECSOT", step_logs=tmp_path)[bench.STEP_LOG_ENV].endswith("steps-SPECSOT.jsonl")
    assert bench.STEP_LOG_ENV not in bench.server_env("plain", step_logs=tmp_path)  # plain has no SPECSOT worker
    assert bench.STEP_LOG_ENV not in bench.server_env("SPECSOT-ctx")  # off unless asked


class _Server:
    """A stand-in with what `_save_server_info` reads: a log path, a process, /server_info."""

    def __init__(self, tmp_path, info):
        self.log_path, self.proc, self.info = tmp_path / "server.log", object(), info

    def get(self, path):
        assert path == "/server_info"
        if isinstance(self.info, Exception):
            raise self.info
        return self.info


def test_a_specsot_servers_state_is_kept_for_the_ceiling_tool(tmp_path, capsys):
    import json

    specsot = {"cost_model": {"target": {"probe_rows": [1], "probe_ms": [10.0], "overhead_ms": 0.1}}}
    info = {"speculative_num_draft_tokens": 6, "model_path": "m", "internal_states": [{"specsot": specsot}]}
    bench._save_server_info("SPECSOT-ctx", _Server(tmp_path, info))
    saved = json.loads((tmp_path / "specsot-state-SPECSOT-ctx.json").read_text())
    assert saved == {"speculative_num_draft_tokens": 6, "specsot": specsot}  # not the launch's arguments
    bench._save_server_info("plain", _Server(tmp_path, info))  # no SPECSOT state to keep
    assert not (tmp_path / "specsot-state-plain.json").exists()
    # A dead server or one without SPECSOT's state is reported, not raised: the servers after it
    # in the caller's `finally` must still stop.
    bench._save_server_info("SPECSOT", _Server(tmp_path, OSError("refused")))
    bench._save_server_info("SPECSOT-x", _Server(tmp_path, {"internal_states": [{}]}))
    out = capsys.readouterr().out
    assert "no SPECSOT state from SPECSOT: refused" in out and "no SPECSOT state from SPECSOT-x" in out
