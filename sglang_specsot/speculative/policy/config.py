"""The budget policy's configuration: SGLang's `--speculative-adaptive-config`, read for SPECSOT.

Validated once at construction, so every later stage may trust it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# In a SPECSOT server's environment, "1": every step drafts the whole window whatever it costs,
# as SGLang's own fixed-step algorithms do (parity tests that must exercise verify; studies of
# what a fixed window does). Unset, SPECSOT sizes each step's drafts from its measured costs.
FIXED_WINDOW_ENV = "SGLANG_SPECSOT_FIXED_WINDOW"


@dataclass(frozen=True)
class AdaptiveConfig:
    """SGLang's `--speculative-adaptive-config` read for SPECSOT, plus SPECSOT's own keys.

    SGLang's format maps a batch size ("1", "8", ...; a batch uses the largest key not above
    its size) to `candidate_steps`; for SPECSOT a candidate is a per-request draft budget in
    tokens (0 = plain decode). SPECSOT's keys live under "specsot" (SGLang's loader skips
    non-numeric keys): `decay`, `prior_accepts`, `prior_misses`, `min_token_prob`,
    `defer_draft_extend`, `explore_share`, `explore_p`, `cold_verifies`, `long_match`,
    `runner_ups`.
    """

    buckets: tuple[tuple[int, tuple[int, ...]], ...]  # (smallest batch size, budgets), increasing
    decay: float = 0.1  # weight of one step's verifies in a group's (and a role's) acceptance estimate
    prior_accepts: float = 1.0  # pseudo-counts of the prior p = 0.5 ...
    prior_misses: float = 1.0  # ... that a group starts from and drifts back to
    min_token_prob: float = 0.05  # a request's budget stops where p^b falls below this
    # With a draft model: a plain step defers the draft-extend to when the draft is next
    # needed (extend_backlog.py); false runs it every step, as SGLang's workers do.
    defer_draft_extend: bool = True
    # With a draft model, share of the time of plain steps that may go to trying drafts
    # again: its estimates learn only from drafted steps, so a batch that stopped drafting
    # drafts one step (the smallest candidate budget) every `explore_every` plain steps.
    # 0 = never. (SoT-context drafts learn from shadow drafts, shadow.py, and never explore.)
    # Exploring is also funded by what drafting saved (`ExploreFund`): the same share of it.
    explore_share: float = 0.05
    # The acceptance exploring hopes to find: a batch explores only where, at this `p` for
    # every request, some budget would beat plain decoding by more than `explore_share` (what
    # exploring may cost). Where even that cannot pay (large batches on a CPU), exploring is
    # pure cost. 0.8 is what a good draft model's chains, or SoT-context chains that copy a
    # sibling or the corpus, accept (docs/benchmarks.md).
    # null: explore on schedule whatever the costs say (to measure acceptance where drafting
    # does not pay: studies, tests), funded or not (`ExploreFund`).
    explore_p: float | None = 0.8
    # A role (plain, skeleton, branch) is cold, and explores off schedule whether exploring is
    # funded or not, until the server has verified its drafts on this many steps. One or two
    # steps are no verdict: two early misses (chains drafted from low-confidence tokens) would
    # set the first-draft acceptance far below what the drafts accept, leave exploring
    # unfunded, and keep the server plain from then on. 0 = never explore off schedule.
    cold_verifies: int = 4
    # With a draft model: a step whose every request's recent tokens match its SoT context
    # (own text, siblings, corpus) over at least this many tokens weighs drafting from the
    # context alone, without the draft model's forwards, at the acceptance such context
    # chains have measured (compared with the committed tokens). 0 = never.
    long_match: int = 12
    # With a draft model's chain that stops by its confidence: beside each drafted token, its
    # second choice may join the verify window where the cost model says the wider verify
    # pays (`pick_runner_ups`): at batch 1 the rows are free. false = chains alone.
    runner_ups: bool = True

    def __post_init__(self) -> None:
        if not self.buckets or any(not c for _, c in self.buckets):
            raise ValueError(f"adaptive config needs at least one batch size with candidates, got {self.buckets}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"specsot.decay={self.decay} outside (0, 1]")
        if self.prior_accepts <= 0 or self.prior_misses <= 0:
            raise ValueError("specsot.prior_accepts and specsot.prior_misses must be positive")
        if not 0.0 <= self.explore_share < 1.0:
            raise ValueError(f"specsot.explore_share={self.explore_share} outside [0, 1)")
        if self.explore_p is not None and not 0.0 < self.explore_p < 1.0:
            raise ValueError(f"specsot.explore_p={self.explore_p} outside (0, 1); null explores on schedule")
        if not isinstance(self.cold_verifies, int) or isinstance(self.cold_verifies, bool) or self.cold_verifies < 0:
            raise ValueError(f"specsot.cold_verifies={self.cold_verifies!r} must be an int >= 0 (0 = never cold)")
        if not isinstance(self.long_match, int) or isinstance(self.long_match, bool) or self.long_match < 0:
            raise ValueError(f"specsot.long_match={self.long_match!r} must be an int >= 0 (0 = never)")
        if not isinstance(self.runner_ups, bool):
            raise ValueError(f"specsot.runner_ups={self.runner_ups!r} must be true or false")
        if not isinstance(self.defer_draft_extend, bool):
            raise ValueError(f"specsot.defer_draft_extend={self.defer_draft_extend!r} must be true or false")

    def candidates(self, bs: int) -> tuple[int, ...]:
        chosen = self.buckets[0][1]
        for min_bs, budgets in self.buckets:
            if bs >= min_bs:
                chosen = budgets
        return chosen

    @classmethod
    def default(cls, max_budget: int) -> AdaptiveConfig:
        """Every budget from 0 (plain) to the verify window's, at every batch size."""
        return cls(buckets=((1, tuple(range(max_budget + 1))),))

    @classmethod
    def from_json(cls, text: str, max_budget: int) -> AdaptiveConfig:
        """Parse SGLang's adaptive config; budgets above `max_budget` are refused (the window
        is sized by --speculative-num-draft-tokens)."""
        data = json.loads(text)
        buckets = []
        for key, entry in sorted(((k, v) for k, v in data.items() if k.isdigit()), key=lambda kv: int(kv[0])):
            steps = entry.get("candidate_steps")
            if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
                raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
            if max(steps) > max_budget:
                raise ValueError(
                    f"BS {key}: candidate_steps {steps} exceed {max_budget} draft tokens "
                    "(--speculative-num-draft-tokens - 1); lower them or raise that flag"
                )
            buckets.append((int(key), tuple(sorted(set(steps)))))
        if not buckets:
            raise ValueError(f'adaptive config needs a batch-size key such as {{"1": {{"candidate_steps": [0, 3]}}}}, got keys {list(data)}')
        own = data.get("specsot", {})
        known = {f.name for f in dataclasses.fields(cls)} - {"buckets"}
        unknown = sorted(set(own) - known) if isinstance(own, dict) else None
        if unknown is None or unknown:
            raise ValueError(f'"specsot" in the adaptive config takes keys {sorted(known)}, got {own!r}')
        return cls(buckets=tuple(buckets), **own)


ADAPTIVE, FIXED = "adaptive", "fixed"


def adaptive_config(server_args, max_budget: int) -> AdaptiveConfig | None:
    """SPECSOT's budget policy: every budget from 0 (plain) to the window's, or as
    --speculative-adaptive-config says with --speculative-adaptive; None for a fixed window
    (SGLANG_SPECSOT_FIXED_WINDOW=1, without the flag).

    Without the flag SPECSOT still sizes every step's drafts from measured costs and
    acceptance: a fixed window loses to plain decoding on large batches of SoT branches,
    where the policy stays level with plain, and the policy matches it at batch 1. It weighs
    every budget, not only the whole window against a plain decode: exploring and catching
    up a whole chain cost more than one-token drafts. Figures: docs/benchmarks.md.

    SGLang turns its own (EAGLE-only) controller off for other algorithms during argument
    resolution and says so in a warning; the flag as the user gave it is still on the
    pristine server_args the worker receives.
    """
    if budget_mode(server_args) == FIXED:
        logger.info("SPECSOT drafts the whole window every step (%s=1)", FIXED_WINDOW_ENV)
        return None
    path = getattr(server_args, "speculative_adaptive_config", None)
    if path is not None and not getattr(server_args, "speculative_adaptive", False):
        # SGLang reads the file only with the flag, and SPECSOT is adaptive without it: a
        # file given alone would be dropped without a word, and a run would measure defaults.
        raise ValueError(
            f"--speculative-adaptive-config {path} is read only with --speculative-adaptive: "
            "add --speculative-adaptive, or drop the config to use SPECSOT's defaults"
        )
    if path is None:
        config = AdaptiveConfig.default(max_budget)
    else:
        with open(path) as f:
            config = AdaptiveConfig.from_json(f.read(), max_budget)
    logger.info("SPECSOT adaptive draft budgets on (SPECSOT's own policy, not SGLang's EAGLE controller): %s", config)
    return config


def budget_mode(server_args) -> str:
    """FIXED with SGLANG_SPECSOT_FIXED_WINDOW=1 and without --speculative-adaptive (the flag
    wins), else ADAPTIVE."""
    value = os.environ.get(FIXED_WINDOW_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{FIXED_WINDOW_ENV}={value!r}: set it to 1 (draft the whole window every step) or 0 / unset")
    if getattr(server_args, "speculative_adaptive", False):
        return ADAPTIVE
    return FIXED if value == "1" else ADAPTIVE
