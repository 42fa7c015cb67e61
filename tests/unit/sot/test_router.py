"""Router rules, the model-verdict path, the eval command, and agreement with labels: on the
held-out part of router_train (never looked at while the rules were revised) and on Vicuna-80."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from sglang_specsot.data import DATA_DIR, load_questions
from sglang_specsot.sot import (
    SoTConfig,
    load_labelled,
    measure_agreement,
    parse_route_reply,
    route_prompt,
    route_question,
)
from sglang_specsot.sot.router import main, system_route
from sglang_specsot.sot.router_head import Suitability

# Vicuna-80: the first rules were written while reading these 80 questions, so agreement here
# is IN-SAMPLE; later revisions were tuned only on the dev folds of router_train. The floors
# sit a few questions below the rules' score (`python -m sglang_specsot.sot.router eval
# vicuna80 --router rules`): they guard against regressions, not a claim.
VICUNA_MIN_ACCURACY = 0.95
VICUNA_MIN_PRECISION = 0.95
VICUNA_MIN_RECALL = 0.90

# router_train.jsonl, split by category: fold = position within its category mod 5. The rules
# were revised looking only at folds 0-2 (dev); folds 3-4 (test, 102 questions) were scored
# once, after the revision was frozen. The floors sit a question or two below that score.
ROUTER_TRAIN = DATA_DIR / "router_train.jsonl"
TEST_FOLDS = (3, 4)
TEST_MIN_ACCURACY = 0.93
TEST_MIN_PRECISION = 0.95
TEST_MIN_RECALL = 0.80

# router_traps.jsonl (42): list-shaped asks about math, code, languages and closed sets; the
# domain and closed_set rules were written looking at it, so it is IN-SAMPLE.
# router_holdout.jsonl (48) was written after those rules were frozen and scored once: the
# rules' out-of-sample check. Never tune the rules on it.
HOLDOUT_MIN = {"accuracy": 0.87, "precision": 0.90, "recall": 0.70}
TRAPS_MIN = {"accuracy": 0.97, "precision": 0.95, "recall": 0.90}

# Questions not in Vicuna-80 nor router_train, labelled by the SoT-R criterion (independent
# points, long enough answer). The rules miss one, the packing-list question.
HELD_OUT = [
    ("What are the benefits of learning a second language?", True),
    ("How can a small business attract more customers online?", True),
    ("What should I pack for a week-long hiking trip?", True),
    ("Give me some tips for writing a good resume.", True),
    ("Compare renting and buying a home.", True),
    ("Why do people procrastinate?", True),
    ("What factors affect the price of a used car?", True),
    ("How do I prepare for a job interview?", True),
    ("Explain the pros and cons of nuclear energy.", True),
    ("What are common mistakes new managers make?", True),
    ("What if humans could photosynthesize?", True),
    ("How can cities reduce traffic congestion?", True),
    ("List the main causes of the French Revolution.", True),
    ("What are the key features of a good password manager?", True),
    ("What are the health effects of drinking coffee every day?", True),
    ("What is the capital of Australia?", False),
    ("Who wrote Pride and Prejudice?", False),
    ("Write a haiku about autumn leaves.", False),
    ("Translate 'good morning' into French.", False),
    ("Write a Python function that reverses a linked list.", False),
    ("What is 17 times 23?", False),
    ("Return the list of planets as a JSON array.", False),
    ("Is it better to rent or to buy a house?", False),
    ("How many legs does a spider have?", False),
    ("Pretend you are a pirate and greet me.", False),
    ("Solve 2x + 5 = 13.", False),
    ("Summarize the plot of Hamlet in one sentence.", False),
    ("Briefly, what are the benefits of exercise?", False),
    ("Call the weather tool for Paris and report the temperature.", False),
    ("Why is the sky blue?", False),
    ("Define photosynthesis.", False),
]


def _vicuna_rows() -> list[dict]:
    return load_questions("vicuna80")


def test_agreement_with_vicuna80_labels():
    rows = _vicuna_rows()
    assert len(rows) == 80 and sum(r["sot_suitable"] for r in rows) == 37
    pairs = [(route_question(r["question"]).use_sot, r["sot_suitable"]) for r in rows]
    result = measure_agreement(pairs)
    assert result.accuracy >= VICUNA_MIN_ACCURACY, result
    assert result.precision >= VICUNA_MIN_PRECISION, result
    assert result.recall >= VICUNA_MIN_RECALL, result


def _router_train_folds() -> list[tuple[int, dict]]:
    seen: Counter[str] = Counter()
    folds = []
    for row in load_questions(ROUTER_TRAIN):
        folds.append((seen[row["category"]] % 5, row))
        seen[row["category"]] += 1
    return folds


def test_agreement_on_router_train_test_folds():
    rows = [row for fold, row in _router_train_folds() if fold in TEST_FOLDS]
    assert len(rows) == 102 and len({r["category"] for r in rows}) == 12
    result = measure_agreement((route_question(r["question"]).use_sot, r["sot_suitable"]) for r in rows)
    assert result.accuracy >= TEST_MIN_ACCURACY, result
    assert result.precision >= TEST_MIN_PRECISION, result
    assert result.recall >= TEST_MIN_RECALL, result


@pytest.mark.parametrize("name, floors", [("router_holdout", HOLDOUT_MIN), ("router_traps", TRAPS_MIN)])
def test_agreement_on_shipped_sets(name, floors):
    rows = load_labelled(name)
    result = measure_agreement((route_question(r.question).use_sot, r.sot_suitable) for r in rows)
    for rate, floor in floors.items():
        assert getattr(result, rate) >= floor, (rate, result)


def test_agreement_on_held_out_questions():
    result = measure_agreement((route_question(q).use_sot, label) for q, label in HELD_OUT)
    assert result.accuracy >= 0.9, result


@pytest.mark.parametrize(
    "question, use_sot, rule",
    [
        ("What are the steps to implement quicksort in Python?", False, "code"),
        ("Implement a stack with two queues.", False, "code"),
        ("```def f(x): return x```\nWhat are the ways to speed this up?", False, "code"),
        ("List three fruits as a JSON array.", False, "structured"),
        ("Use the search tool calls to find ways to save money.", False, "structured"),
        ("Calculate the area of a circle of radius 3.", False, "math"),
        ("If the points are (1, 2) and (4, 6), what is the distance?", False, "math"),
        ("How do you say 'good night' in Italian?", False, "translate"),
        ("List the cities mentioned in this text: I flew from Oslo to Rome.", False, "extract"),
        ("Name the tallest mountain in Europe.", False, "default"),
        ("Name three ways to save water at home.", True, "list_ask"),
        ("What would happen if the oceans froze?", True, "list_ask"),
        ("What causes inflation?", False, "mechanism"),
        ("Which factors drive house prices?", True, "list_noun"),
        ("Draft an outline of the topics a first-aid course should cover.", True, "list_noun"),
        ("How many piano tuners are in Chicago? Explain step-by-step.", False, "estimate"),
        ("Write a short story about a dragon.", False, "writing"),
        ("Can you help me draft a cover letter?", False, "writing"),
        ("Write a list of tips for new runners.", True, "list_noun"),
        ("As a pirate, describe your ship and the dangers you face.", False, "roleplay"),
        ("As a beginner, how can I learn the guitar?", True, "list_ask"),
        ("Should we ban cars from city centres or tax them?", False, "choice"),
        ("Can you explain the fundamentals of machine learning?", True, "list_noun"),
        ("Who painted the Mona Lisa?", False, "single_fact"),
        ("What is entropy?", False, "single_fact"),
        ("How does a refrigerator work?", False, "mechanism"),
        ("In one sentence, what are the ways to save energy?", False, "brevity"),
        ("What are the most effective ways to deal with stress?", True, "list_ask"),
        ("What if the Roman Empire had never fallen?", True, "list_ask"),
        ("", False, "empty"),
    ],
)
def test_rules(question, use_sot, rule):
    decision = route_question(question)
    assert (decision.use_sot, decision.rule) == (use_sot, rule), decision
    assert decision.source == "rules" and decision.reason


@pytest.mark.parametrize(
    "system, rule",
    [("You are a helpful assistant.", None),
     ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", None),
     ("Always answer in French.", None),
     ("You are a pirate. Talk like one.", None),
     # FastChat's Vicuna prompt and Llama 2's default, as clients send them
     ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
      "helpful, detailed, and polite answers to the user's questions.", None),
     ("You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, "
      "while being safe. If you don't know the answer to a question, please don't share false "
      "information.", None),
     ("Think step by step before answering.", "system_estimate"),
     ("Reply in JSON with the keys title and body.", "system_structured"),
     ("You write Python code for a living.", "system_code"),
     ("Be concise.", "system_brevity"),
     ("Keep every answer under 100 words.", "system_brevity")],
)  # fmt: skip
def test_a_system_prompt_keeps_the_answer_normal_only_when_it_trips_a_hard_rule(system, rule):
    decision = system_route(system)
    assert (decision and decision.rule) == rule
    assert decision is None or (not decision.use_sot and decision.reason.startswith("the system prompt: "))


def test_a_length_limit_in_the_question_is_a_short_answer():
    assert route_question("Explain the causes of inflation in under 50 words.").rule == "brevity"


def test_short_answer_cap_routes_normal():
    question = "What are the most effective ways to deal with stress?"
    assert route_question(question, max_new_tokens=1024).use_sot
    capped = route_question(question, max_new_tokens=64)
    assert not capped.use_sot and capped.rule == "short_cap"
    assert "64" in capped.reason
    lenient = SoTConfig(router_min_answer_tokens=32)
    assert route_question(question, lenient, max_new_tokens=64).use_sot


def test_model_reply_overrides_soft_rules_only():
    listy = "What are the most effective ways to deal with stress?"
    assert route_question(listy, model_reply="DIRECT") == parse_route_reply("DIRECT")
    fact = "Who painted the Mona Lisa?"
    assert route_question(fact, model_reply="LIST").use_sot
    # SoT must never touch code, whatever the model says.
    code = route_question("Implement binary search in Python.", model_reply="LIST")
    assert not code.use_sot and code.rule == "code"
    # An unreadable reply falls back to the rules.
    assert route_question(listy, model_reply="hmm, hard to say").rule == "list_ask"


@pytest.mark.parametrize(
    "reply, use_sot",
    [
        ("LIST", True),
        ("DIRECT", False),
        (" list.", True),
        ("Direct", False),
        ("Answer: LIST", True),
        ("The answer is DIRECT because it is code.", False),
        ("Yes, it can be split.", True),
        ("No.", False),
        ("I would say this is a list of tips, so LIST", True),
    ],
)
def test_parse_route_reply(reply, use_sot):
    verdict = parse_route_reply(reply)
    assert verdict is not None and verdict.use_sot is use_sot and verdict.source == "model"


@pytest.mark.parametrize("reply", ["", "hmm", "I am not sure.", "Nobody knows"])
def test_parse_route_reply_without_verdict(reply):
    assert parse_route_reply(reply) is None


def test_route_prompt_names_both_verdicts():
    prompt = route_prompt("Why do cats purr?")
    user = prompt.messages[-1]["content"]
    assert "Why do cats purr?" in user and "LIST" in user and "DIRECT" in user
    assert prompt.assistant_prefix == ""


def test_measure_agreement_rates():
    pairs = [(True, True), (True, False), (False, True), (False, False), (True, True)]
    result = measure_agreement(pairs)
    assert (result.true_pos, result.false_pos, result.false_neg, result.true_neg) == (2, 1, 1, 1)
    assert result.accuracy == pytest.approx(3 / 5)
    assert result.precision == pytest.approx(2 / 3)
    assert result.recall == pytest.approx(2 / 3)
    empty = measure_agreement([])
    assert (empty.accuracy, empty.precision, empty.recall) == (0.0, 0.0, 0.0)


def _eval_lines(capsys, target) -> list[str]:
    main(["eval", str(target), "--router", "rules"])
    return capsys.readouterr().out.strip().splitlines()


def test_eval_command_prints_one_json_line_last(capsys, tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [("Write a haiku about rain.", False), ("What are the benefits of cycling to work?", True),
            ("Solve 3x = 12.", False), ("Who wrote Hamlet?", True)]  # mislabelled on purpose: a FN
    path.write_text("".join(json.dumps({"question": q, "sot_suitable": l}) + "\n\n" for q, l in rows))
    last = json.loads(_eval_lines(capsys, path)[-1])
    assert list(last) == ["n", "accuracy", "precision", "recall"]
    assert last == {"n": 4, "accuracy": 0.75, "precision": 1.0, "recall": 0.5}


def test_eval_command_takes_a_shipped_name(capsys):
    last = json.loads(_eval_lines(capsys, "vicuna80")[-1])
    assert last["n"] == 80 and last["precision"] >= VICUNA_MIN_PRECISION


def test_eval_command_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "sglang_specsot.sot.router", "eval", "router_train", "--router", "rules"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["n"] == len(load_questions(ROUTER_TRAIN)) and last["accuracy"] >= 0.9
    assert "RuntimeWarning" not in out.stderr


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"question": "Why?", "sot_suitable": true}', "{oops"], ":2: not valid JSON"),
        (['{"sot_suitable": true}'], ':1: needs a non-empty string "question"'),
        (['{"question": "Why?"}'], ':1: needs a boolean "sot_suitable"'),
        (['{"question": "Why?", "sot_suitable": "yes"}'], ':1: needs a boolean "sot_suitable"'),
        (['["Why?", true]'], ":1: expected a JSON object"),
        ([""], "no questions"),
    ],
)
def test_eval_command_names_the_bad_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=None) as info:
        load_labelled(path)
    assert message in str(info.value) and str(path) in str(info.value)
    for router in ("rules", "classifier"):  # the file is checked before a classifier loads
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", str(path), "--router", router], load_classifier=_no_classifier)
        assert message in str(exit_info.value.code)


def _no_classifier(head=None):
    raise AssertionError("the classifier must not load for a bad file")


def test_eval_command_rejects_a_missing_file_and_bad_usage(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["eval", str(tmp_path / "missing.jsonl")])
    assert "missing.jsonl" in str(info.value.code) and "vicuna80" in str(info.value.code)
    for argv in (["score", "vicuna80"], ["eval", "vicuna80", "--router", "model"], ["eval"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert "usage:" in str(info.value.code), argv


def test_eval_command_with_a_classifier(capsys, tmp_path):
    """The default router: the hard rules first (math stays normal even at P=0.99), then the
    classifier's verdict instead of the soft rules."""
    path = tmp_path / "q.jsonl"
    rows = [("Solve 3x = 12.", False), ("Why is the sky blue?", True), ("Tips for sleeping well?", False)]
    path.write_text("".join(json.dumps({"question": q, "sot_suitable": l}) + "\n" for q, l in rows))
    verdicts = {"Solve 3x = 12.": 0.99, "Why is the sky blue?": 0.7, "Tips for sleeping well?": 0.1}
    main(["eval", str(path)], load_classifier=lambda head: lambda q: Suitability(verdicts[q], 0.5))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "router: the hard rules, then the question classifier"
    assert json.loads(lines[-1]) == {"n": 3, "accuracy": 1.0, "precision": 1.0, "recall": 1.0}


def test_eval_command_scores_the_head_it_is_given(capsys, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "Why is the sky blue?", "sot_suitable": True}) + "\n")
    heads = []
    main(["eval", str(path), "--head", "other.json"],
         load_classifier=lambda head: heads.append(head) or (lambda q: Suitability(0.9, 0.5)))  # fmt: skip
    assert heads == ["other.json"] and json.loads(capsys.readouterr().out.splitlines()[-1])["recall"] == 1.0
    for argv in (["eval", str(path), "--head"], ["eval", str(path), "--head", "h.json", "--router", "rules"],
                 ["eval", str(path), "--model", "m"], ["eval", str(path), "--head", "a", "--head", "b"]):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main(argv, load_classifier=_no_classifier)
        assert "usage:" in str(info.value.code), argv


def test_eval_command_names_a_head_it_cannot_read(tmp_path):
    from sglang_specsot.models.router_classifier import load_classifier

    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "Why is the sky blue?", "sot_suitable": True}) + "\n")
    with pytest.raises(SystemExit) as info:  # read before the embedding model would load
        main(["eval", str(path), "--head", str(tmp_path / "nope.json")], load_classifier=load_classifier)
    assert "cannot read a router head" in str(info.value.code) and "nope.json" in str(info.value.code)


def test_eval_command_says_how_to_get_the_classifier():
    with pytest.raises(SystemExit) as info:
        main(["eval", "vicuna80"])
    assert "python -m sglang_specsot.sot.router" in str(info.value.code)
    assert "--router rules" in str(info.value.code)
