"""Pure-torch sampling-verify ops that SGLang 0.5.23 has only for CUDA, MUSA and NPU.

Without them `eagle_sample` commits the target's argmax on CPU even for temperature > 0
(sglang/srt/speculative/eagle_utils.py:485-500, :641), which changes the output distribution
of every sampled request. Paths below are relative to the installed `sglang` package.

* `tree_speculative_sampling_target_only`: the JIT-CUDA kernel
  (kernels/jit/include/sgl_kernel/speculative/sampling.cuh:39-175, host checks in
  kernels/jit/csrc/speculative/sampling.cuh:34-77, wrapper kernels/ops/speculative/sampling.py:33),
  same signature, same in-place outputs. The kernel works in float32 with parallel sums; this
  version sums in float64, sequentially, so the two can differ only when a coin lands within
  rounding of a boundary.
* `top_k_renorm_prob` / `top_p_renorm_prob`: flashinfer's renorm contract
  (kernels/ops/sampling/renorm.py), with the cut-off and tie order of SGLang's own CPU sampler
  (srt/layers/sampler.py:821-827), so a request with one of top-k / top-p is verified against the
  distribution the non-speculative CPU path samples from.
"""

from __future__ import annotations

import torch


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,  # mutable, int32 (bs * num_draft_tokens,)
    accept_index: torch.Tensor,  # mutable, int32 (bs, num_spec_tokens)
    accept_token_num: torch.Tensor,  # mutable, int32 (bs,)
    candidates: torch.Tensor,  # int64 (bs, num_draft_tokens); column 0 is the root
    retrive_index: torch.Tensor,  # int64 (bs, num_draft_tokens): flat row in predicts
    retrive_next_token: torch.Tensor,  # int64 (bs, num_draft_tokens): first child or -1
    retrive_next_sibling: torch.Tensor,  # int64 (bs, num_draft_tokens): next sibling or -1
    uniform_samples: torch.Tensor,  # float32 (bs, num_draft_tokens): one coin per tree node
    uniform_samples_for_final_sampling: torch.Tensor,  # float32 (bs,)
    target_probs: torch.Tensor,  # float32 (bs, num_draft_tokens, vocab)
    draft_probs: torch.Tensor,  # mutable, float32 (bs, num_draft_tokens, vocab)
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,  # the kernel's choice of scan; this version is always sequential
) -> None:
    """Target-only tree speculative sampling: walk the draft tree from the root, at each node
    accept a child by inverse-CDF sampling of the target over the siblings tried so far, then
    sample the bonus token from the target with the rejected siblings removed.

    Writes predicts at the accepted nodes and the last one (the bonus), accept_index[b, :n+1],
    accept_token_num (accepted drafts, bonus excluded) and, as the kernel does, copies the
    target probability of every rejected token into draft_probs.
    """
    _check_inputs(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs,
        threshold_single, threshold_acc,
    )  # fmt: skip
    bs, n = candidates.shape
    if bs == 0:
        return
    num_steps = accept_index.shape[1]
    # pair_probs[b][i][j] = target probability, at node i, of node j's token: all the walk reads.
    index = candidates.unsqueeze(1).expand(bs, n, n)
    pair_probs = torch.gather(target_probs, 2, index).tolist()
    tables = [t.tolist() for t in (candidates, retrive_next_token, retrive_next_sibling)]
    coins = uniform_samples.tolist()
    thresholds = (float(threshold_single), max(float(threshold_acc), 1e-9))  # kernel clamps acc
    walks = [
        _walk(*(tab[b] for tab in tables), coins[b], pair_probs[b], num_steps, *thresholds)
        for b in range(bs)
    ]
    _mark_rejected(draft_probs, target_probs, walks)
    bonus = _sample_bonus(
        target_probs, draft_probs, uniform_samples_for_final_sampling, walks, num_steps
    )
    outputs = (predicts, accept_index, accept_token_num)
    _write_outputs(*outputs, candidates, retrive_index, walks, bonus)


def _walk(
    cand: list[int],
    next_token: list[int],
    next_sibling: list[int],
    coins: list[float],
    pair_probs: list[list[float]],
    num_steps: int,
    threshold_single: float,
    threshold_acc: float,
) -> tuple[list[int], list[tuple[int, int]]]:
    """One request's walk (sampling.cuh:72-99): accepted nodes, root first, and the
    (node, token) pairs rejected on the way."""
    path, rejected = [0], []
    coin = coins[0]
    for _ in range(1, num_steps):
        node = path[-1]
        child, prob_acc = next_token[node], 0.0
        # The kernel's sibling loop is unbounded; bounding it by the tree size only stops a
        # malformed sibling cycle from hanging the process.
        for _ in range(len(cand)):
            if child == -1:
                break
            p = pair_probs[node][child]
            prob_acc += p
            # Accept with probability P(coin < mass of the siblings so far): over the siblings this
            # is inverse-CDF sampling from the target, so each token keeps its target probability.
            if p > 0 and (coin < prob_acc / threshold_acc or p >= threshold_single):
                break
            rejected.append((node, cand[child]))
            child = next_sibling[child]
        else:
            child = -1
        if child == -1:
            break
        path.append(child)
        coin = coins[child]
    return path, rejected


def _mark_rejected(draft_probs, target_probs, walks) -> None:
    # sampling.cuh:93: draft_probs[node, token] = target_probs[node, token] for each rejection,
    # so relu(target - draft) below has the rejected siblings removed.
    cells = [(b, node, tok) for b, (_, rejected) in enumerate(walks) for node, tok in rejected]
    if not cells:
        return
    b, node, tok = torch.tensor(cells, dtype=torch.long).unbind(1)
    draft_probs[b, node, tok] = target_probs[b, node, tok]


def _sample_bonus(target_probs, draft_probs, final_coins, walks, num_steps: int) -> torch.Tensor:
    """Bonus token per request: inverse-CDF sample of relu(target - draft) at the last accepted
    node with the final coin (sampling.cuh:101-173)."""
    bs, _, vocab = target_probs.shape
    rows = torch.arange(bs)
    last = torch.tensor([path[-1] for path, _ in walks])
    # "there is no draft_probs for the bonus token" once the whole depth was accepted.
    full_depth = torch.tensor([len(path) == num_steps for path, _ in walks])
    target = target_probs[rows, last].double()
    draft = draft_probs[rows, last].double().masked_fill(full_depth.unsqueeze(1), 0.0)
    residual = (target - draft).clamp_min(0.0)
    cdf = residual.cumsum(-1)
    u = final_coins.double() * cdf[:, -1]
    valid = residual > 0
    hit = (cdf > u.unsqueeze(1)) & valid
    first_hit = hit.int().argmax(-1)
    # When rounding leaves u at or above the total, the kernel takes the last token with mass,
    # and vocab - 1 when there is none.
    last_valid = vocab - 1 - valid.flip(-1).int().argmax(-1)
    fallback = torch.where(valid.any(-1), last_valid, torch.full_like(last_valid, vocab - 1))
    return torch.where(hit.any(-1), first_hit, fallback)


def _write_outputs(
    predicts, accept_index, accept_token_num, candidates, retrive_index, walks, bonus
) -> None:
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    slots, tokens, rows, cols, accepted = [], [], [], [], []
    for b, (path, _) in enumerate(walks):
        # predicts at each accepted node's flat row holds the token that follows it.
        next_tokens = [cand[b][node] for node in path[1:]] + [int(bonus[b])]
        for k, (node, token) in enumerate(zip(path, next_tokens)):
            slots.append(ridx[b][node])
            tokens.append(token)
            rows.append(b)
            cols.append(k)
        accepted.append(len(path) - 1)
    assert predicts.is_contiguous(), f"predicts must be contiguous, got strides {predicts.stride()}"
    predicts.view(-1)[torch.tensor(slots)] = torch.tensor(tokens, dtype=predicts.dtype)
    accept_index[torch.tensor(rows), torch.tensor(cols)] = torch.tensor(slots, dtype=torch.int32)
    accept_token_num[: len(walks)] = torch.tensor(accepted, dtype=torch.int32)


def _check_inputs(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, final_coins, target_probs, draft_probs,
    threshold_single, threshold_acc,
) -> None:  # fmt: skip
    """The JIT kernel's host checks (csrc/speculative/sampling.cuh:54-77)."""
    bs, n = candidates.shape
    for name, t in [
        ("candidates", candidates), ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token), ("retrive_next_sibling", retrive_next_sibling),
    ]:  # fmt: skip
        assert t.shape == (bs, n) and t.dtype == torch.int64, (
            f"{name} must be int64 {(bs, n)}, got {t.dtype} {tuple(t.shape)}"
        )
    spec = accept_index.shape[-1]
    for name, t, shape, dtype in [
        ("accept_index", accept_index, (bs, spec), torch.int32),
        ("accept_token_num", accept_token_num, (bs,), torch.int32),
        ("predicts", predicts, (bs * n,), torch.int32),
        ("uniform_samples", uniform_samples, (bs, n), torch.float32),
        ("uniform_samples_for_final_sampling", final_coins, (bs,), torch.float32),
        ("target_probs", target_probs, (bs, n, target_probs.shape[-1]), torch.float32),
        ("draft_probs", draft_probs, tuple(target_probs.shape), torch.float32),
    ]:
        assert tuple(t.shape) == shape and t.dtype == dtype, (
            f"{name} must be {dtype} {shape}, got {t.dtype} {tuple(t.shape)}"
        )
    assert n > 0 and spec > 0 and target_probs.shape[-1] > 0, (
        f"empty tree or vocabulary: draft_tokens={n}, spec_tokens={spec}, "
        f"vocab={target_probs.shape[-1]}"
    )
    for name, value in [("threshold_single", threshold_single), ("threshold_acc", threshold_acc)]:
        if not 0.0 <= value <= 1.0:
            flag = "--speculative-accept-" + name.replace("_", "-")
            raise ValueError(
                f"{name} must be in [0, 1], got {value}; set {flag} in that range "
                "(1.0 keeps verification lossless)"
            )


# --- top-k / top-p renormalisation ---------------------------------------------------------


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Keep each row's top_k largest probabilities and renormalise; a top_k at or above the
    vocabulary (SGLang's TOP_K_ALL) keeps the row."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)
    sorted_probs = sorted_probs.masked_fill(ranks >= _per_row(top_k, probs), 0.0)
    return _scatter_renormalised(sorted_probs, order)


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Keep each row's most likely tokens until their mass reaches top_p (the token that
    crosses it included) and renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before > _per_row(top_p, probs), 0.0)
    return _scatter_renormalised(sorted_probs, order)


def _per_row(value: torch.Tensor | float, probs: torch.Tensor) -> torch.Tensor:
    value = torch.as_tensor(value, device=probs.device)
    return value.reshape(-1, 1) if value.dim() else value


def _scatter_renormalised(sorted_probs: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    kept = torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)
