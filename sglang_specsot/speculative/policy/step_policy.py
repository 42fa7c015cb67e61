"""The budget policy as one object: each step's plan from measured costs and acceptance, and
what it learns from every verify and every step's time.

The worker asks `decide` before it drafts, feeds `learn` what verify accepted and `observe`
what the step cost; a drafter that learns more mid-step (a draft model's confidence after a
catch-up) asks `replan`. Drafts are priced by the drafter's `DraftCosts`; what the drafter
must do before it can draft this batch (`StepPricing`) is asked lazily, since it is host work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sglang_specsot.costs.cost_model import StepCostTable
from sglang_specsot.speculative.policy.acceptance import (
    ChainAcceptance,
    DepthAcceptance,
)
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import (
    StepPlan,
    best_plan,
    candidate_plans,
    explore_every,
    explore_plan,
    may_pay,
)  # fmt: skip
from sglang_specsot.speculative.policy.runs import DraftingRuns, ExploreFund
from sglang_specsot.speculative.policy.tiers import VerifyTiers
from sglang_specsot.speculative.policy.values import (
    DraftCosts,
    StepDecision,
    StepOutcome,
    StepPricing,
    StepView,
    Verified,
    runs_key,
)  # fmt: skip

logger = logging.getLogger(__name__)

# Plain steps a batch size is given to measure its plain step before drafting plans are weighed
# against the model's price of it again (a plain step that cannot be measured, e.g. one that
# had to catch up, must not keep a server from drafting).
MEASURE_PLAIN_TRIES = 8
# Steps within which a batch size's plain step must have been measured `min_seen` times, or
# the next steps that would draft run plain to measure it again. A fresh server's first steps
# run cold (oneDNN builds kernels for each new shape: the 1.5B's first plain steps took 250-900
# ms against 140), and a plain step priced at a cold time would keep a server drafting at a
# loss; measured again every this many steps, at 3 plain steps each, where drafting pays 1.5x
# the cost is about 1% of its gain.
PLAIN_FRESH_STEPS = 100


class StepPolicy:
    """Per-step draft budgets that maximise expected committed tokens per ms on this machine.

    `config` None is the fixed window (every request drafts `window - 1` tokens every step);
    the acceptance estimates are kept either way, for /server_info and the step log.
    """

    def __init__(
        self, config: AdaptiveConfig | None, window: int, costs: DraftCosts, log_candidates: bool = False, name: str = "main"
    ):  # fmt: skip
        self.name = name  # what its decisions carry as their `planner`
        self.config = config
        self.log_candidates = log_candidates  # decisions carry every candidate's price (the step log)
        self.window = window  # verify rows per request at most, the root included
        # The widths verify runs at: a step's width is priced at the tier it is padded to
        # (set by the worker once it knows whether graphs replay; every width by default).
        self.tiers = VerifyTiers.every(window)
        self.costs = costs
        self.stats = ChainAcceptance(config or AdaptiveConfig.default(window - 1))
        self.by_depth: dict[str, DepthAcceptance] = {}
        self.measured = StepCostTable(skip_first=True)  # real step times, where the cost model prices them wrong
        self.drafting_runs = DraftingRuns()  # how long drafting lasts once begun, and what it saves
        self.explore_fund = ExploreFund(self.stats.config.explore_share)  # exploring spends what drafting saved
        self.last_plan: StepPlan | None = None
        self.steps = 0
        self._plain_steps = 0  # plain steps since the last drafted one (exploring's schedule)
        self.explored = 0
        self.hopeless = 0  # exploring steps skipped: drafting could not pay even at explore_p
        self.unrepaid = 0  # drafting plans turned plain: their setup would not be repaid in time
        self.timed = False  # whether steps are timed here (the host waits for forwards)
        self._plain_tries: dict[int, int] = {}  # batch size -> plain steps taken to measure one
        self.plain_measuring = 0  # drafting plans turned plain to measure the plain step

    @property
    def adaptive(self) -> bool:
        return self.config is not None

    # -- planning --------------------------------------------------------------------------

    def decide(self, view: StepView, pricing: StepPricing) -> StepDecision:
        """The plan of the step about to draft: the budgets that pay, plain where none does,
        now and then an exploring step (`_maybe_explore`)."""
        if self.config is None:
            plan = StepPlan(self.window, (self.window - 1,) * view.bs, 0.0, 0.0)
            return StepDecision(view, plan, (), (), exploring=False, adaptive=False, planner=self.name)
        ps = self.acceptance(view)
        firsts = self.first_acceptance(view)
        plans = self.plans(ps, pricing.first_acceptance(firsts))
        candidates = self._candidates_logged(plans) if self.log_candidates else None
        plan, exploring = best_plan(plans), False
        if plan.width > 1 and not self.setup_repaid(view, plan, pricing):
            self.unrepaid += 1
            plan = self.plain_plan(view.bs)
        if plan.width > 1 and self.measures_plain(view.bs):
            self._plain_tries[view.bs] = self._plain_tries.get(view.bs, 0) + 1
            self.plain_measuring += 1
            plan = self.plain_plan(view.bs)
            self._plain_steps = 0
        elif plan.width == 1:
            plan, exploring = self._maybe_explore(view, pricing, ps, plan)
        else:
            self._plain_steps = 0
        self.last_plan = plan
        return StepDecision(
            view, plan, tuple(ps), tuple(firsts), exploring, adaptive=True, candidates=candidates, planner=self.name
        )  # fmt: skip

    def replan(self, decision: StepDecision, firsts: Sequence[float]) -> StepDecision:
        """`decision` again with better first-draft estimates (a draft model's confidence,
        known only after its catch-up); an exploring step keeps its plan: it drafts to learn."""
        if decision.exploring or not decision.adaptive:
            return decision
        plans = self.plans(decision.ps, firsts)
        plan = self.last_plan = best_plan(plans)
        candidates = self._candidates_logged(plans) if self.log_candidates else None
        return StepDecision(decision.view, plan, decision.ps, decision.firsts, False, True, candidates, self.name)

    def plans(self, ps: Sequence[float], firsts: Sequence[float] | None) -> list[StepPlan]:
        """One plan per candidate budget, narrowest first."""
        return candidate_plans(
            ps, self.candidate_budgets(len(ps)), self.step_ms, self.config.min_token_prob, self.costs.min_budget, firsts,
        )  # fmt: skip

    def candidate_budgets(self, bs: int) -> tuple[int, ...]:
        return self.costs.candidate_budgets(self.config.candidates(bs))

    def measures_plain(self, bs: int) -> bool:
        """Whether a step of `bs` requests that would draft runs plain instead, to measure
        what a plain step costs here: where steps are timed and fewer than `min_seen` plain
        steps of this batch size were measured in the last PLAIN_FRESH_STEPS steps, for up to
        MEASURE_PLAIN_TRIES steps.

        Every drafting plan is weighed against a plain step. Priced from the start-up probe
        alone, a plain step can be overpriced several times (a probe run while another process
        took the cores), and a plan never chosen is never measured: the server would draft at
        a loss to plain decoding for good. A plain step is what the server does anyway where
        drafting does not pay, so measuring it costs at most a few steps' gain where drafting
        does. The drafter defers its extend on such a step (`DeferredExtend._defer`), as plans
        price it."""
        measured = self.measured
        if not (self.adaptive and self.timed) or measured.seen_within(bs, 1, PLAIN_FRESH_STEPS) >= measured.min_seen:
            self._plain_tries.pop(bs, None)
            return False
        return self._plain_tries.get(bs, 0) < MEASURE_PLAIN_TRIES

    def plain_plan(self, bs: int) -> StepPlan:
        return StepPlan(1, (0,) * bs, float(bs), self.step_ms(bs, 1))

    def step_ms(self, bs: int, width: int) -> float:
        """What a step costs, at the verify tier its width pads to: as measured lately where
        known, else as the drafter's costs price it plus what a narrower step measured beyond
        its price (`unmodelled_ms`); where the drafter's steps of one width cost alike, never
        more than a wider step measured at this batch size (noise must not price a width out
        of being measured)."""
        width = self.tiers.padded(width)
        measured = self.measured.ms(bs, width)
        ms = measured if measured is not None else self.costs.modelled_ms(bs, width) + self.unmodelled_ms(bs, width)
        wider = self.measured.wider_ms(bs, width) if self.costs.bounded_by_wider else None
        return ms if wider is None else min(ms, wider)

    def unmodelled_ms(self, bs: int, width: int) -> float:
        """What the nearest narrower step measured at this batch size cost beyond the model's
        price for it (0 where none is measured, or the model prices it dearer): host work each
        step pays (scheduling, sampling) and the forward's drift from the start-up probe,
        which a wider step pays too. Left out, an unmeasured width is priced against a plain
        step's real time from the bare forwards: on an AVX2 CPU, a plain step measured at
        140 ms against a 2-row verify modelled at 158 ms prices drafting at 1.13x a plain
        step where it costs about 1.5x, and drafting runs begin that never pay."""
        nearest = self.measured.narrower(bs, width)
        if nearest is None:
            return 0.0
        narrow, ms = nearest
        return max(0.0, ms - self.costs.modelled_ms(bs, narrow))

    def acceptance(self, view: StepView) -> list[float]:
        """Each request's chance a draft is accepted given its parent was (its group's estimate)."""
        return [self.stats.p(key, role) for key, role in zip(view.keys, view.roles)]

    def first_acceptance(self, view: StepView) -> list[float]:
        """Each request's running acceptance of its first draft."""
        return [self.stats.first(key, role) for key, role in zip(view.keys, view.roles)]

    @staticmethod
    def _candidates_logged(plans: list[StepPlan]) -> dict[str, list[float]]:
        return {str(p.width): [round(p.expected_tokens, 4), round(p.step_ms, 3)] for p in plans}

    # -- setup and runs --------------------------------------------------------------------

    def setup_repaid(self, view: StepView, plan: StepPlan, pricing: StepPricing) -> bool:
        """Whether drafting as `plan` does saves more than the setup it needs first in the
        steps it will draft: as many as the batch has left, or fewer where drafting runs
        begun at this batch have measured shorter; never where those runs lost on average,
        setup included. A catch-up after many plain steps can cost more than a few drafting
        steps save."""
        setup = pricing.setup_ms()
        if setup <= 0.0:
            return True
        if self.runs_lose(view):
            return False
        plain = self.plain_plan(view.bs)
        saved = plan.expected_tokens / plain.rate - plan.step_ms  # ms a step saves against plain
        horizon = view.steps_left(plan.expected_tokens / view.bs)
        runs = self.drafting_runs.expected(view.runs_key)
        if runs is not None:
            horizon = min(horizon, runs)
        return saved > 0.0 and saved * horizon > setup

    def runs_lose(self, view: StepView) -> bool:
        """Whether drafting runs begun at this batch measured a loss, setup included: at its
        own key or, until that has a verdict, at the largest smaller batch of the same roles
        that has one. A draft gains less the more rows a plain step fills, so runs that lose
        at 3 branches lose at 4; not the other way, so a smaller batch's win ends the search."""
        for size in range(view.bs, 0, -1):
            verdict = self.drafting_runs.pays(runs_key(size, view.role_set))
            if verdict is not None:
                return not verdict
        return False

    # -- exploring -------------------------------------------------------------------------

    def _maybe_explore(
        self, view: StepView, pricing: StepPricing, ps: list[float], plain: StepPlan
    ) -> tuple[StepPlan, bool]:  # fmt: skip
        """The plain `plain`, or once every `explore_every` plain steps a step that drafts the
        smallest budget: estimates learn only from drafted steps, or from free shadow drafts
        (then a batch never explores)."""
        if self.costs.learns_from_shadows:
            return plain, False
        cold = self._cold(view)
        if not cold and self.config.explore_p is not None and not self.explore_fund.allows():
            # Asked first: pricing the schedule (a backlog's catch-up) is host time on every
            # plain step, and while unfunded the schedule does not advance.
            self.explore_fund.unfunded += 1
            return plain, False
        explore = explore_plan(ps, self.candidate_budgets(len(ps)), self.step_ms)
        every = explore_every(plain.step_ms, explore.step_ms + pricing.setup_ms(), self.config.explore_share)
        self._plain_steps += 1
        if every == 0 or explore.width == 1:
            return plain, False
        if self._plain_steps < every and not cold:
            return plain, False
        self._plain_steps = 0
        if not self._worth_exploring(view.bs):
            self.hopeless += 1
            return plain, False
        self.explored += 1
        return explore, True

    def _cold(self, view: StepView) -> bool:
        """Whether to explore now, off schedule and funded or not: drafts of some request's
        role were verified on fewer than `cold_verifies` steps, so its plans rest on another
        role's acceptance or the blind prior. At most `cold_verifies` steps per role in a
        server's life; not where drafting could not pay even at `explore_p`."""
        need = self.config.cold_verifies
        unknown = any(self.stats.verifies(role) < need for role in view.roles)
        return unknown and self._worth_exploring(view.bs)

    def _worth_exploring(self, bs: int) -> bool:
        """Whether drafting could pay for this batch size at the acceptance exploring hopes
        for (`explore_p`) by more than exploring costs (`explore_share`)."""
        c = self.config
        if c.explore_p is None:
            return True  # exploring on schedule, asked for
        return may_pay(self.plans([c.explore_p] * bs, None), c.explore_share)

    # -- learning --------------------------------------------------------------------------

    def learn(self, view: StepView, verified: Verified) -> None:
        """One verify's evidence: the shadow drafts walked, then each request's tree. The
        branches of a group verified together count as one step of their estimate."""
        with self.stats.one_step():
            for i, depth, accepted in verified.shadows:
                self._observe(view, i, "shadow", depth, accepted)
            for i, (depth, accepted) in enumerate(zip(verified.depths, verified.accepted)):
                self._observe(view, i, verified.source, depth, min(accepted, depth))
        self.steps += 1

    def _observe(self, view: StepView, i: int, source: str, depth: int, accepted: int) -> None:
        self.stats.observe(view.keys[i], depth, accepted, view.roles[i])
        if depth > 0:
            self.by_depth.setdefault(source, DepthAcceptance()).observe(depth, accepted)

    def observe(self, outcome: StepOutcome) -> None:
        """A step's time and tokens: what drafting saved against plain decoding (the drafting
        runs' verdicts, exploring's fund) and, where it is what such a step costs, its time."""
        view, decision = outcome.view, outcome.decision
        self.timed = self.timed or outcome.timed
        if self.adaptive:
            # Wall-clock time means something only where the host waits for the forward; on a
            # GPU under overlap nothing is measured (no verdicts; the fund stays at 0).
            saved = self._saved_ms(outcome) if outcome.timed else 0.0
            self.drafting_runs.step(view.runs_key, outcome.drafted, decision.exploring, saved)
            if self.drafting_runs.exploring_run:
                self.explore_fund.charge(saved)
            else:
                self.explore_fund.earn(saved)
        if self._measures_cost(outcome):
            self.measured.observe(view.bs, self.tiers.padded(outcome.priced_width), outcome.ms)

    def _measures_cost(self, outcome: StepOutcome) -> bool:
        """Whether the step's time is what a step of its batch and width costs: not where a
        catch-up ran, nor a plain step that flushed the backlog (plans price a plain step as
        deferring its extend); counted, it would make every drafting step look like a saving."""
        if not outcome.timed or outcome.caught_up:
            return False
        return outcome.priced_width > 1 or not outcome.extended_on_plain_step

    def _saved_ms(self, outcome: StepOutcome) -> float:
        """A drafting step's committed tokens at a plain step's time per token, less its time;
        a plain step that extended the draft its time beyond a plain step's; else nothing."""
        bs = outcome.view.bs
        plain_ms = self.step_ms(bs, 1)
        if outcome.drafted:
            return outcome.committed * plain_ms / bs - outcome.ms
        return min(0.0, plain_ms - outcome.ms) if outcome.extended_on_plain_step else 0.0

    # -- reporting -------------------------------------------------------------------------

    def forget(self, rid: str) -> None:
        self.stats.forget(rid)  # a group's estimate outlives its members

    def report(self) -> dict:
        plan = self.last_plan
        return {
            "measured_step_ms": self.measured.info(),
            "acceptance_p": dict(list(self.stats.info().items())[-32:]),  # newest groups: first, p
            "acceptance_prior_by_role": self.stats.priors(),
            "last_plan": None if plan is None else {"width": plan.width, "budgets": list(plan.budgets)},
            "exploring_steps": self.explored,
            "exploring_skipped": self.hopeless,
            "explore_fund": self.explore_fund.info(),
            "drafting_not_repaid": self.unrepaid,
            "plain_measuring_steps": self.plain_measuring,
            "drafting_runs": self.drafting_runs.info(),
            "drafting_runs_total": self.drafting_runs.totals(),
            "acceptance_by_depth": {source: d.info() for source, d in self.by_depth.items()},
        }
