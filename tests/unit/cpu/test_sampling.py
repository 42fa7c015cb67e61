"""sglang_specsot.cpu.sampling: the torch target-only tree sampler and top-k/top-p renorm.

Three kinds of checks:
* the op equals a plain-Python transcription of SGLang's JIT-CUDA kernel
  (kernels/jit/include/sgl_kernel/speculative/sampling.cuh:39-175) on random trees and coins;
* speculative sampling is lossless: with an arbitrary (wrong) draft tree, the first committed
  token, and the first two jointly, follow the target (chi-squared goodness of fit, alpha 0.001,
  fixed seeds), with and without top-k / top-p; and two deliberately wrong samplers fail the
  same check, so it can fail;
* in a fresh CPU process the plugin makes eagle_sample take the sampling branch with these ops.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from sglang_specsot.cpu import sampling as S
from tests.stats import chi2_sf, goodness_of_fit
from tests.unit import cpu_checks

# --- plain-Python references ---------------------------------------------------------------


def ref_tree_sampling(
    cand, ridx, next_tok, next_sib, coins, final_coins, target, draft,
    num_steps, predicts, accept_index, accept_num, t_single=1.0, t_acc=1.0,
):  # fmt: skip
    """The CUDA kernel's control flow on nested lists; mutates the four output lists."""
    t_acc = max(t_acc, 1e-9)
    for b in range(len(cand)):
        prob_acc, row, coin = 0.0, 0, coins[b][0]
        last = ridx[b][0]
        accept_index[b][0] = last
        num, cur = 0, 0
        for _ in range(1, num_steps):
            cur = next_tok[b][cur]
            while cur != -1:
                tok = cand[b][cur]
                p = target[b][row][tok]
                prob_acc += p
                if p > 0 and (coin < prob_acc / t_acc or p >= t_single):
                    prob_acc, row, coin = 0.0, cur, coins[b][cur]
                    predicts[last] = tok
                    num += 1
                    accept_index[b][num] = ridx[b][cur]
                    last = ridx[b][cur]
                    break
                draft[b][row][tok] = target[b][row][tok]
                cur = next_sib[b][cur]
            if cur == -1:
                break
        accept_num[b] = num
        q = target[b][row]
        d = draft[b][row] if num != num_steps - 1 else [0.0] * len(q)
        relu = [max(qi - di, 0.0) for qi, di in zip(q, d)]
        total = 0.0
        for x in relu:
            total += x
        u = final_coins[b] * total
        agg, sampled, last_valid = 0.0, None, -1
        for i, x in enumerate(relu):
            agg += x
            if x > 0:
                last_valid = i
                if sampled is None and agg > u:
                    sampled = i
        if sampled is None:
            sampled = last_valid if last_valid != -1 else len(q) - 1
        predicts[last] = sampled


def ref_top_k(row: list[float], k: int) -> list[float]:
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept = {i: row[i] for i in order[:k]}
    total = sum(kept.values())
    return [kept.get(i, 0.0) / total for i in range(len(row))]


def ref_top_p(row: list[float], p: float) -> list[float]:
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept, mass = {}, 0.0
    for i in order:
        if mass > p:  # the token that crosses p is kept, later ones are not
            break
        kept[i] = row[i]
        mass += row[i]
    total = sum(kept.values())
    return [kept.get(i, 0.0) / total for i in range(len(row))]


# --- random trees --------------------------------------------------------------------------


def random_tree(rng: random.Random, n: int, vocab: int, max_depth: int):
    """(tokens, parent) of a tree whose node 0 is the root; siblings carry distinct tokens."""
    tokens, parent, depth = [rng.randrange(vocab)], [-1], [0]
    for _ in range(1, n):
        p = rng.choice([i for i in range(len(tokens)) if depth[i] < max_depth])
        taken = {tokens[c] for c in range(len(tokens)) if parent[c] == p}
        tokens.append(rng.choice([t for t in range(vocab) if t not in taken]))
        parent.append(p)
        depth.append(depth[p] + 1)
    return tokens, parent


def tree_links(parent: list[int]) -> tuple[list[int], list[int]]:
    """retrive_next_token / retrive_next_sibling: children in node order."""
    n = len(parent)
    next_tok, next_sib = [-1] * n, [-1] * n
    last_child: dict[int, int] = {}
    for c in range(1, n):
        p = parent[c]
        if p in last_child:
            next_sib[last_child[p]] = c
        else:
            next_tok[p] = c
        last_child[p] = c
    return next_tok, next_sib


def random_case(seed: int, bs: int, n: int, vocab: int, nonzero_draft: bool):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    max_depth = rng.randint(1, n - 1)
    trees = [random_tree(rng, n, vocab, max_depth) for _ in range(bs)]
    links = [tree_links(parent) for _, parent in trees]
    probs = torch.rand(bs, n, vocab, generator=gen) ** 3
    probs[torch.rand(bs, n, vocab, generator=gen) < 0.3] = 0.0  # tokens the target rules out
    probs[:, :, 0] += 1e-3  # no all-zero row
    probs /= probs.sum(-1, keepdim=True)
    coins = torch.rand(bs, n, generator=gen)
    final = torch.rand(bs, generator=gen)
    final[0] = 1.0 - 2**-24  # the largest coin SGLang hands out (eagle_utils.py:453)
    coins[:, 0][1::3] = 0.0
    draft = torch.rand(bs, n, vocab, generator=gen) * 0.2 * nonzero_draft
    return dict(
        candidates=torch.tensor([t for t, _ in trees]),
        retrive_index=torch.arange(bs * n).view(bs, n),
        retrive_next_token=torch.tensor([nt for nt, _ in links]),
        retrive_next_sibling=torch.tensor([ns for _, ns in links]),
        uniform_samples=coins,
        uniform_samples_for_final_sampling=final,
        target_probs=probs,
        draft_probs=draft,
        num_steps=rng.randint(2, max_depth + 2),  # also shorter than the tree: full-depth bonus
    )


def run_op(case: dict, **thresholds) -> dict:
    bs, n = case["candidates"].shape
    out = dict(
        predicts=torch.full((bs * n,), -7, dtype=torch.int32),
        accept_index=torch.full((bs, case["num_steps"]), -1, dtype=torch.int32),
        accept_token_num=torch.full((bs,), -1, dtype=torch.int32),
        draft_probs=case["draft_probs"].clone(),
    )
    inputs = {k: v for k, v in case.items() if k not in ("num_steps", "draft_probs")}
    S.tree_speculative_sampling_target_only(
        out["predicts"], out["accept_index"], out["accept_token_num"],
        draft_probs=out["draft_probs"], **inputs, **thresholds,
    )  # fmt: skip
    return out


def run_ref(case: dict, t_single=1.0, t_acc=1.0) -> dict:
    bs, n = case["candidates"].shape
    predicts, accept_index = [-7] * (bs * n), [[-1] * case["num_steps"] for _ in range(bs)]
    accept_num, draft = [-1] * bs, case["draft_probs"].tolist()
    lists = {k: v.tolist() for k, v in case.items() if k != "num_steps"}
    ref_tree_sampling(
        lists["candidates"], lists["retrive_index"], lists["retrive_next_token"],
        lists["retrive_next_sibling"], lists["uniform_samples"],
        lists["uniform_samples_for_final_sampling"], lists["target_probs"], draft,
        case["num_steps"], predicts, accept_index, accept_num, t_single, t_acc,
    )  # fmt: skip
    return dict(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, draft_probs=draft
    )


# --- (a) the op against the reference -------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("bs", "n", "vocab"), [(1, 2, 3), (5, 6, 9), (16, 10, 33)])
def test_op_matches_kernel_reference(seed, bs, n, vocab):
    case = random_case(seed * 101 + n, bs, n, vocab, nonzero_draft=seed % 4 == 3)
    thresholds = {}
    if seed % 3 == 0:
        thresholds = dict(threshold_single=0.35 + seed / 40, threshold_acc=0.6 + seed / 60)
    got, want = run_op(case, **thresholds), run_ref(case, *thresholds.values())
    assert got["predicts"].tolist() == want["predicts"]
    assert got["accept_index"].tolist() == want["accept_index"]
    assert got["accept_token_num"].tolist() == want["accept_token_num"]
    assert got["draft_probs"].tolist() == want["draft_probs"]


def test_references_exercise_every_branch():
    """The random cases above reach rejection, full-depth acceptance and the bonus fallbacks."""
    accepted, rejected_all, full_depth = 0, 0, 0
    for seed in range(12):
        case = random_case(seed * 101 + 10, 16, 10, 33, nonzero_draft=False)
        out = run_ref(case)
        for b, num in enumerate(out["accept_token_num"]):
            accepted += num > 0
            rejected_all += num == 0
            full_depth += num == case["num_steps"] - 1
    assert accepted and rejected_all and full_depth, (accepted, rejected_all, full_depth)


def test_empty_batch_and_bad_thresholds():
    case = random_case(0, 3, 4, 5, nonzero_draft=False)
    empty = {k: (v[:0] if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    assert run_op(empty)["predicts"].numel() == 0
    with pytest.raises(ValueError, match=r"threshold_acc must be in \[0, 1\], got 1.5"):
        run_op(case, threshold_acc=1.5)


@pytest.mark.parametrize("seed", range(5))
def test_renorm_matches_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(7, 11, generator=gen) * 2, -1)
    ks = torch.tensor([1, 2, 3, 5, 10, 11, 1 << 30], dtype=torch.int32)  # 1 << 30: TOP_K_ALL
    ps = torch.tensor([0.05, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0])
    got_k, got_p = S.top_k_renorm_prob(probs, ks), S.top_p_renorm_prob(probs, ps)
    rows = probs.tolist()
    want_k = [ref_top_k(r, min(int(k), 11)) for r, k in zip(rows, ks)]
    want_p = [ref_top_p(r, float(p)) for r, p in zip(rows, ps.tolist())]
    torch.testing.assert_close(got_k, torch.tensor(want_k), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_p, torch.tensor(want_p), rtol=1e-6, atol=1e-7)


def test_top_p_keeps_the_crossing_token_and_scalar_arguments():
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    # 0.5 is below 0.6, so the 0.25 that crosses it stays; the CPU sampler's rule (sampler.py:827).
    want = torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]])
    torch.testing.assert_close(S.top_p_renorm_prob(probs, 0.6), want)
    assert S.top_k_renorm_prob(probs, 1).tolist() == [[1.0, 0.0, 0.0, 0.0]]


# --- (b) losslessness: chi-squared against the target -----------------------------------------

VOCAB = 6
DRAWS = 20_000
ALPHA = 0.001
START = 0  # the context token before the first committed one
# The draft tree used for every verify: root 0 -> {1, 2, 3}, 1 -> {4, 5}, 2 -> {6}, 4 -> {7}.
PARENT = [-1, 0, 0, 0, 1, 1, 2, 4]
NUM_STEPS = 4  # deepest node (7) is at depth 3
# The target's logits after each token (a Markov chain); distinct values, so no top-k ties.
LOGITS = [
    [1.2 * math.sin(1.7 * i + 2.3 * j + 0.5 * i * j) for j in range(VOCAB)] for i in range(VOCAB)
]
TEMPERATURE = 0.8


@pytest.mark.parametrize(
    ("x", "dof", "sf"),
    # Textbook critical values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.4).
    [(3.841, 1, 0.05), (11.070, 5, 0.05), (20.515, 5, 0.001), (43.773, 30, 0.05),
     (66.619, 35, 0.001), (59.703, 30, 0.001), (1.145, 5, 0.95)],
)  # fmt: skip
def test_chi2_sf_matches_tables(x, dof, sf):
    assert chi2_sf(x, dof) == pytest.approx(sf, rel=2e-3)


def target_rows(top_k: int | None, top_p: float | None) -> torch.Tensor:
    """The target's next-token distributions, as eagle_sample builds them: softmax(logits / T),
    then top-k renorm, then top-p renorm (eagle_utils.py:720-740)."""
    probs = torch.softmax(torch.tensor(LOGITS) / TEMPERATURE, -1)
    if top_k is not None:
        probs = S.top_k_renorm_prob(probs, torch.full((VOCAB,), top_k, dtype=torch.int32))
    if top_p is not None:
        probs = S.top_p_renorm_prob(probs, torch.full((VOCAB,), top_p))
    return probs


def expected_rows(top_k: int | None, top_p: float | None) -> list[list[float]]:
    """The same distributions computed independently in plain Python."""
    rows = []
    for i in range(VOCAB):
        logits = [x / TEMPERATURE for x in LOGITS[i]]
        top = max(logits)
        w = [math.exp(x - top) for x in logits]
        row = [x / sum(w) for x in w]
        row = ref_top_k(row, top_k) if top_k is not None else row
        rows.append(ref_top_p(row, top_p) if top_p is not None else row)
    return rows


def draft_tokens(rng: random.Random, root: int) -> list[int]:
    """An arbitrary draft: siblings distinct, biased towards high token ids whatever the target."""
    tokens = [root]
    for node in range(1, len(PARENT)):
        taken = {tokens[c] for c in range(1, node) if PARENT[c] == PARENT[node]}
        choices = [t for t in range(VOCAB) if t not in taken]
        tokens.append(rng.choices(choices, weights=[1 + t * t for t in choices])[0])
    return tokens


def speculative_draws(rows: torch.Tensor, seed: int, **thresholds) -> list[tuple[int, int]]:
    """DRAWS runs of speculative decoding from START; the first two committed tokens of each."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    next_tok, next_sib = tree_links(PARENT)
    n = len(PARENT)
    committed: list[list[int]] = [[] for _ in range(DRAWS)]
    active = list(range(DRAWS))
    while active:
        bs = len(active)
        roots = [committed[i][-1] if committed[i] else START for i in active]
        cand = torch.tensor([draft_tokens(rng, r) for r in roots])
        out = run_op(
            dict(
                candidates=cand,
                retrive_index=torch.arange(bs * n).view(bs, n),
                retrive_next_token=torch.tensor([next_tok] * bs),
                retrive_next_sibling=torch.tensor([next_sib] * bs),
                uniform_samples=torch.rand(bs, n, generator=gen),
                uniform_samples_for_final_sampling=torch.rand(bs, generator=gen),
                target_probs=rows[cand].contiguous(),  # row i: the target after node i's token
                draft_probs=torch.zeros(bs, n, VOCAB),  # eagle_sample's target-only zeros
                num_steps=NUM_STEPS,
            ),
            **thresholds,
        )
        predicts, accept_index = out["predicts"].tolist(), out["accept_index"].tolist()
        for b, i in enumerate(active):
            num = int(out["accept_token_num"][b])
            committed[i] += [predicts[accept_index[b][k]] for k in range(num + 1)]
        active = [i for i in active if len(committed[i]) < 2]
    return [(c[0], c[1]) for c in committed]


def fit_first_and_pair(draws, rows) -> dict[str, tuple[float, int, float]]:
    first_counts, pair_counts = {}, {}
    for t1, t2 in draws:
        first_counts[t1] = first_counts.get(t1, 0) + 1
        pair_counts[(t1, t2)] = pair_counts.get((t1, t2), 0) + 1
    first = {t: rows[START][t] for t in range(VOCAB)}
    pair = {(a, b): rows[START][a] * rows[a][b] for a in range(VOCAB) for b in range(VOCAB)}
    return {
        "first": goodness_of_fit(first_counts, first),
        "pair": goodness_of_fit(pair_counts, pair),
    }


FILTERS = {  # (top_k, top_p); top_k=5 then top_p=0.7 differs from both on the rows reached
    "plain": (None, None),
    "top_k=4": (4, None),
    "top_p=0.8": (None, 0.8),
    "top_k=5,top_p=0.7": (5, 0.7),
}


@pytest.mark.parametrize("name", FILTERS)
def test_speculative_sampling_preserves_the_target(name):
    top_k, top_p = FILTERS[name]
    rows = target_rows(top_k, top_p)
    expected = expected_rows(top_k, top_p)
    torch.testing.assert_close(rows, torch.tensor(expected), rtol=1e-5, atol=1e-6)
    fits = fit_first_and_pair(speculative_draws(rows, seed=1234), expected)
    for what, (stat, dof, p_value) in fits.items():
        assert p_value > ALPHA, f"{name}, {what}: chi2={stat:.1f}, dof={dof}, p={p_value:.2e}"


def _one_coin_walk(walk):
    def mutant(cand, next_token, next_sibling, coins, *rest):
        return walk(cand, next_token, next_sibling, [coins[0]] * len(coins), *rest)

    return mutant


MUTANTS = {
    # The kernel's own lossy knob: threshold_acc < 1 accepts drafts more often than the target.
    "threshold_acc=0.5": lambda mp: {"threshold_acc": 0.5},
    # Bonus token drawn without removing the rejected siblings from the target.
    "no-residual": lambda mp: mp.setattr(S, "_mark_rejected", lambda *a: None) or {},
    # The root's coin reused at every depth: the first token stays right, the pair does not.
    "one-coin": lambda mp: mp.setattr(S, "_walk", _one_coin_walk(S._walk)) or {},
}


@pytest.mark.parametrize("name", MUTANTS)
def test_wrong_samplers_fail_the_same_check(name, monkeypatch):
    thresholds = MUTANTS[name](monkeypatch)
    rows = target_rows(None, None)
    draws = speculative_draws(rows, seed=1234, **thresholds)
    fits = fit_first_and_pair(draws, expected_rows(None, None))
    assert min(p for _, _, p in fits.values()) < ALPHA, fits


# --- (c) the host change in a fresh CPU process (the one the unit tests share) --------------

UNBOUND_BEFORE_THE_PLUGIN = cpu_checks.add("sampler-unbound-before-the-plugin", """
import sglang.srt.speculative.eagle_utils as eu
assert eu.tree_speculative_sampling_target_only is None  # bound before the plugin ran
""", before_plugin=True)  # fmt: skip
ROUTED_AFTER_REGISTER = cpu_checks.add("sampler-routed-after-register", """
import sglang.srt.speculative.eagle_utils as eu
from sglang_specsot.plugin import register
register()
from sglang_specsot.cpu import sampling
import sglang.kernels.ops.sampling.renorm as renorm
import sglang.kernels.ops.speculative.verify_sampling as vs
flags = dict(is_cpu=True, is_hip=False, is_xpu=False)
assert eu._verify_uses_greedy(is_all_greedy=False, use_rejection_sampling=False, **flags) is False
assert eu._verify_uses_greedy(is_all_greedy=True, use_rejection_sampling=False, **flags) is True
assert eu._verify_uses_greedy(is_all_greedy=False, use_rejection_sampling=True, **flags) is True
for module in (eu, renorm, vs):
    for name in ("tree_speculative_sampling_target_only", "top_k_renorm_prob", "top_p_renorm_prob"):
        if hasattr(module, name):
            assert getattr(module, name) is getattr(sampling, name), (module.__name__, name)
from sglang.kernels.ops.sampling.renorm import top_k_renorm_prob  # a later importer
assert top_k_renorm_prob is sampling.top_k_renorm_prob
# Bound under their own names only: no None global elsewhere was rewritten to an op.
names = ("tree_speculative_sampling_target_only", "top_k_renorm_prob", "top_p_renorm_prob")
ops = {id(getattr(sampling, n)): n for n in names}
import sys
stray = [(m.__name__, k) for m in list(sys.modules.values()) if m is not None and m is not sampling
         for k, v in list(getattr(m, "__dict__", {}).items()) if id(v) in ops and k != ops[id(v)]]
assert not stray, stray
""")


def test_plugin_routes_cpu_verify_to_the_sampler(cpu_process):
    cpu_process(UNBOUND_BEFORE_THE_PLUGIN)
    cpu_process(ROUTED_AFTER_REGISTER)
