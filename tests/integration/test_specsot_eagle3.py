"""SPECSOT drafting with an EAGLE-3 head on this CPU: SmolLM2-135M (float32) and a one-layer
head reading three of its layers, written by `train-eagle3` (four prompts, one epoch: barely
trained, 4,096 draft ids) and loaded by SGLang's own loader, SGLang's EAGLE V2 draft worker under
SPECSOT's worker, the SoT context filling the rest of each verify window.

Proves: greedy output token-identical to plain decoding on 21 prompts at batch sizes 1..6, the
head drafting every step (SGLANG_SPECSOT_FIXED_WINDOW=1), overlap on (default tier; off in the
long tier: the scheduler loops are the same path for every drafter, and the draft-model and
context servers run both in the default tier), through the static-shape twin of the CUDA path (FULL mask layout, verify tiers); the sampling distribution
kept (temperature 1, top-k 5: chi-squared against the target's own probabilities); with the
cost-aware policy, the head costs SoT branches no accepted tokens (accept length >= 0.95x the
context drafter's alone on the same SoT groups); a head that cannot draft for the target is
refused at launch, the flag and the fix named.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sglang_specsot.data import load_questions
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models.eagle3.train import TrainConfig
from sglang_specsot.sot import expansion_prompt
from sglang_specsot.speculative.static_shape import STATIC_SHAPE_ENV
from sglang_specsot.speculative.tree_masks import LAYOUT_ENV
from tests.integration.conftest import (
    FIXED_WINDOW_ENV,
    SMOLLM2_PARITY_TOKENS,
    SPECSOT,
    assert_every_step_replayed_a_tier,
    cpu_args,
    leak_checked_server,
    scheduler_loop_line,
)
from tests.integration.heads import eagle3_head_dir, head_dir, trained_eagle3_head
from tests.integration.parity import POINTS, TWIN_PROMPTS, load_tokenizer, mismatches, run_batches
from tests.stats import goodness_of_fit

pytestmark = pytest.mark.integration

COMMON = cpu_args(max_total_tokens=8192, mem_fraction_static=0.5)
MAX_NEW = 16
assert MAX_NEW <= SMOLLM2_PARITY_TOKENS  # the reference: a prefix of the session's plain run
NUM_PROMPTS = TWIN_PROMPTS  # the plain run's first 6 batches, sizes 1..6: its servers are static-shape twins
# A 3-step chain (4 nodes) plus 2 SoT-context nodes in a 6-token verify window.
CHAIN = ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6"]
# train-eagle3's scores walk chains of its training depth: the most one verify yields, bonus included.
TRAIN_STEPS = TrainConfig().steps
TRAIN_REACH = TRAIN_STEPS + 1
DUMMY = ["--speculative-draft-load-format", "dummy"]


@pytest.fixture(scope="module")
def trained(smollm2_path, tmp_path_factory) -> tuple[str, dict]:
    return trained_eagle3_head(smollm2_path, tmp_path_factory.mktemp("eagle3"))


@pytest.fixture(scope="module")
def head(trained) -> str:
    """A head `train-eagle3` wrote (barely trained, 4,096 draft ids), loaded by SGLang for real."""
    return trained[0]


def test_train_eagle3_writes_a_head_sglang_loads(trained, smollm2_path):
    """The user's command end to end on a small target; the servers below load what it wrote."""
    head, provenance = trained
    files = {p.name for p in Path(head).iterdir()}
    assert {"config.json", "model.safetensors", "provenance.json", "tokenizer.json"} <= files
    config = json.loads(Path(head, "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 4096
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # SmolLM2: 30 layers
    assert provenance["answers"]["count"] == 4 and provenance["heldout"]["sequences"] == 1
    print("eagle3 provenance:", json.dumps({k: provenance[k] for k in ("heldout", "scored_on")}))
    # An accept length counts the bonus token, so ">= 1.0" held for any head, trained or not. A
    # barely trained head's offline scores may accept nothing, so what is checked here is that
    # each score is one: tokens over verifies, within the reach of a chain of the training depth
    # (train-eagle3's --steps, bonus included). That drafts are accepted is the served head's check (test_eagle3_greedy_parity).
    (scored,) = provenance["scored_on"].values()
    assert scored["sequences"] == 2
    for score in (provenance["heldout"], scored):
        assert score["verifies"] > 0 and score["accept_length"] == round(score["tokens"] / score["verifies"], 4), score
        assert 1.0 <= score["accept_length"] <= TRAIN_REACH and len(score["step_acc"]) == TRAIN_STEPS, score
        assert all(0.0 <= a <= 1.0 for a in score["step_acc"]), score
    for context in (scored["context_drafter_accept_length"], scored["context_drafter_shared_corpus"]):
        assert 1.0 <= context <= TRAIN_REACH, scored


def _head_args(head: str, load: list[str] = ()) -> list[str]:
    return COMMON + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", head, *load]


@pytest.fixture(
    scope="module",
    params=[pytest.param(m, id=f"eagle3-{m}-full_layout-static_shape", marks=[pytest.mark.long] if m == "no-overlap" else [])
            for m in ("overlap", "no-overlap")],
)  # fmt: skip
def eagle3_server(request, smollm2_path, head, smollm2_parity, tmp_path_factory):
    log = tmp_path_factory.mktemp("specsot-eagle3") / "server.log"
    extra = CHAIN + ([] if request.param == "overlap" else ["--disable-overlap-schedule"])
    env = FIXED_WINDOW_ENV | {LAYOUT_ENV: "full", STATIC_SHAPE_ENV: "1"}
    # Its teardown, after every test on this server, proves the idle memory check passed.
    with leak_checked_server(smollm2_path, _head_args(head) + extra, log, env=env) as server:
        server.mode = request.param
        prompts, ids = smollm2_parity
        server.prompts, server.plain_ids = prompts[:NUM_PROMPTS], [i[:MAX_NEW] for i in ids[:NUM_PROMPTS]]
        yield server


def test_eagle3_greedy_parity(eagle3_server):
    results = run_batches(eagle3_server, eagle3_server.prompts, MAX_NEW)
    bad = mismatches(results, eagle3_server.plain_ids)
    assert not bad, f"SPECSOT with an EAGLE-3 head ({eagle3_server.mode}) differs from plain decoding on prompts {bad}"
    log = eagle3_server.log_path.read_text()
    assert "SPECSOT drafts with" in log and "(eagle3): 4-node chain per request, up to 2 SoT-context nodes more" in log
    assert scheduler_loop_line(eagle3_server.mode == "overlap") in log
    graphs = assert_every_step_replayed_a_tier(eagle3_server, static_shape=True)
    assert graphs["tiers"] == [1, 6], graphs  # a head's tiers: a plain step and the window
    specsot = eagle3_server.get("/server_info")["internal_states"][0]["specsot"]
    assert specsot["draft_kind"] == "eagle3" and specsot["draft_int8"] is None
    # Every step drafted (fixed window): every request was verified at the window's width.
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in results)
    # Drafts were accepted: an accept length of 1.0 (the bonus token alone) is what a server whose
    # verify accepted nothing reports.
    accept = eagle3_server.get("/server_info")["internal_states"][0]["avg_spec_accept_length"]
    assert accept > 1.0, accept


SAMPLES = 400
SAMPLE_BATCH = 40  # within --max-running-requests 48
TOP_K = 5


def test_eagle3_sampling_keeps_the_targets_distribution(eagle3_server, smollm2_path):
    """The second token (the first one verify samples) of 400 draws, given the commonest
    first token, against the target's top-5 renormalised probabilities, read from a prefill
    of the same server (no drafting in a prefill). Siblings of earlier batches are in the
    shared corpus, so the SoT context drafts likely tokens that verify accepts or rejects."""
    if eagle3_server.mode != "overlap":
        pytest.skip("one sampling run is enough: the sampling kernel is the same with overlap off")
    tok = load_tokenizer(smollm2_path)
    prompt = tok.encode("My favourite colour is")
    params = {"temperature": 1.0, "top_k": TOP_K, "max_new_tokens": 2, "ignore_eos": True}
    draws = []
    for _ in range(SAMPLES // SAMPLE_BATCH):
        out = eagle3_server.post("/generate", {"input_ids": [prompt] * SAMPLE_BATCH, "sampling_params": params})
        draws += [tuple(r["output_ids"]) for r in out]
    first = max({d[0] for d in draws}, key=[d[0] for d in draws].count)
    seconds = [d[1] for d in draws if d[0] == first]
    assert len(seconds) >= 100, f"too few draws with first token {first}: {len(seconds)}"
    probe = {"input_ids": prompt + [first], "return_logprob": True, "top_logprobs_num": TOP_K,
             "sampling_params": {"temperature": 0, "max_new_tokens": 1}}  # fmt: skip
    top = eagle3_server.post("/generate", probe)["meta_info"]["output_top_logprobs"][0]
    weights = {token: math.exp(logprob) for logprob, token, *_ in top}
    total = sum(weights.values())
    probs = {token: w / total for token, w in weights.items()}
    counts = {t: seconds.count(t) for t in set(seconds)}
    stat, dof, p = goodness_of_fit(counts, probs)
    assert p > 0.001, f"second tokens {counts} do not follow the target's {probs} (chi2={stat:.1f}, dof={dof}, p={p:.2g})"


# -- the merge must not crowd out the context's candidates ----------------------------------

GROUPS = 4  # questions, each a SoT group of its 4 points: mean accept lengths near 2.8 (context) and 3.0 (head)
BRANCH_TOKENS = 48


def _sot_groups(tokenizer) -> list[tuple[list[str], list[dict]]]:
    chat = lambda m: tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)  # noqa: E731
    questions = [row["question"] for row in load_questions("vicuna80")][:GROUPS]
    groups = []
    for g, question in enumerate(questions):
        texts = [expansion_prompt(question, POINTS, i).render(chat) for i in range(len(POINTS))]
        params = [{"temperature": 0, "max_new_tokens": BRANCH_TOKENS,
                   "custom_params": {"specsot": {"group": f"q{g}", "role": "branch", "point": i, "n": len(POINTS)}}}
                  for i in range(len(POINTS))]  # fmt: skip
        groups.append((texts, params))
    return groups


def _accept_length(server, groups) -> float:
    lengths = []
    for texts, params in groups:
        for r in server.post("/generate", {"text": texts, "sampling_params": params}):
            lengths.append(r["meta_info"]["spec_accept_length"])
    return sum(lengths) / len(lengths)


@pytest.mark.long  # two more servers comparing accept lengths: benchmark-like; parity is above
def test_eagle3_head_leaves_the_context_its_accepted_drafts(smollm2_path, head, tmp_path):
    """The same SoT groups on two servers with the cost-aware policy: the SoT context alone, and
    the random head merged with it. A head whose drafts are never accepted must not take the
    window from context candidates that would have been."""
    groups = _sot_groups(load_tokenizer(smollm2_path))
    accept = {}
    for name, args in (("context", COMMON + SPECSOT), ("eagle3", _head_args(head) + CHAIN)):
        with ServerProcess(smollm2_path, args, log_path=tmp_path / f"{name}.log") as server:
            accept[name] = _accept_length(server, groups)
    # Adaptive chains, but no deferred extend: a head's extend reads the step's hidden states.
    assert "the eagle3 head extends every step" in (tmp_path / "eagle3.log").read_text()
    print(f"mean accept length on {GROUPS} SoT groups: {accept}")
    assert accept["context"] > 1.2, accept  # siblings draft from each other: a real baseline
    assert accept["eagle3"] >= 0.95 * accept["context"], accept


def test_eagle3_head_of_another_hidden_size_is_refused_at_launch(smollm2_path, tmp_path):
    # A head trained for a wider target (12 heads of 64, as SGLang validates a config first).
    bad = eagle3_head_dir(smollm2_path, tmp_path / "head", hidden_size=768, num_attention_heads=12, num_key_value_heads=4)
    server = ServerProcess(smollm2_path, _head_args(bad, DUMMY), log_path=tmp_path / "server.log", startup_timeout=300)
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    log = server.log_path.read_text()
    assert "SPECSOT: --speculative-draft-model-path=" in log
    assert "it reads hidden states of size 768 and the target's hidden_size is 576" in log and "SpecForge" in log


@pytest.mark.long  # one more server; the EAGLE-3 tests above cover the shared path
def test_an_eagle2_head_drafts_through_the_same_path(smollm2_path, smollm2_parity, tmp_path):
    """An EAGLE(-2) head (the target's last hidden state, no aux layers) is served the same way."""
    head = head_dir(smollm2_path, tmp_path / "eagle2", "LlamaForCausalLMEagle")
    prompts, ids = smollm2_parity
    args = _head_args(head, DUMMY) + CHAIN
    with ServerProcess(smollm2_path, args, log_path=tmp_path / "server.log", env=FIXED_WINDOW_ENV) as server:
        results = run_batches(server, prompts[:15], MAX_NEW)  # batches of 1 to 5
        kind = server.get("/server_info")["internal_states"][0]["specsot"]["draft_kind"]
    assert not mismatches(results, [i[:MAX_NEW] for i in ids[:15]])
    assert kind == "eagle" and "(eagle): 4-node chain per request" in (tmp_path / "server.log").read_text()
