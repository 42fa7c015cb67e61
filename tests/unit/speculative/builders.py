"""The worker and its drafters built without SGLang, for unit tests of a decode step's parts:
real objects (`__new__` where their constructor needs a server), a fake draft model, and
the batches and verify results the worker hands its parts."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from sglang_specsot.costs.cost_model import CostModel, ForwardCost
from sglang_specsot.speculative import device
from sglang_specsot.speculative.draft_kind import DraftKind
from sglang_specsot.speculative.draft_tree import DraftTree, pad_tree
from sglang_specsot.speculative.drafters.context import ContextDrafting
from sglang_specsot.speculative.drafters.model import ModelCosts, ModelDrafting
from sglang_specsot.speculative.drafters.model_extend import DeferredExtend
from sglang_specsot.speculative.extend_backlog import ExtendBacklog
from sglang_specsot.speculative.malloc_trim import MallocTrim
from sglang_specsot.speculative.policy.acceptance import AcceptanceStats, FirstDraftCalibration
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import StepPlan
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import StepDecision
from sglang_specsot.speculative.rank_agreement import SOLO, TimingLedger
from sglang_specsot.speculative.requests import RequestBook
from sglang_specsot.speculative.telemetry import Telemetry
from sglang_specsot.speculative.verify_runners import EagerVerify
from sglang_specsot.speculative.worker import SpecSoTWorker

WINDOW = 8  # verify rows per request at most (SPECSOT's default window)


def cost(rows: tuple[int, ...] = (1, 2), ms: tuple[float, ...] = (100.0, 200.0)) -> CostModel:
    """The target's forward at `ms` for `rows` rows; by default rows cost in proportion (a
    verify of w rows costs w plain steps), so no draft pays."""
    return CostModel(target=ForwardCost(probe_rows=rows, probe_ms=ms))


def set_target(model: CostModel, rows: tuple[int, ...], ms: tuple[float, ...]) -> None:
    """Reprice the target in place: the policy, its drafter and the worker share one CostModel."""
    model.target = ForwardCost(probe_rows=rows, probe_ms=ms)


def context_worker(
    config: AdaptiveConfig | None, model: CostModel | None = None, shadows: bool = True, step_log=None
) -> SpecSoTWorker:
    """A worker drafting from the SoT context, with what its step and report read; `shadows`
    False: its policy learns only from drafted steps (as with a draft model), so it explores."""
    model = model if model is not None else cost()
    requests = RequestBook()
    drafter = ContextDrafting(requests, model, adaptive=config is not None)
    drafter.costs.learns_from_shadows = shadows and config is not None
    return _worker(config, model, requests, drafter, step_log)


def model_worker(
    config: AdaptiveConfig, model=None, costs: CostModel | None = None, deferred: bool = True
) -> SpecSoTWorker:
    """A worker drafting with a draft model on the CPU (`model_drafting`)."""
    drafter = model_drafting(config, model, costs, deferred)
    return _worker(config, drafter.cost, drafter.context.requests, drafter, None)


def _worker(config, model: CostModel, requests: RequestBook, drafter, step_log) -> SpecSoTWorker:
    worker = SpecSoTWorker.__new__(SpecSoTWorker)
    worker.cost, worker.adaptive, worker.num_draft_tokens, worker.timed = model, config, WINDOW, False
    worker.requests, worker.drafter = requests, drafter
    worker.context = drafter if isinstance(drafter, ContextDrafting) else drafter.context
    worker.telemetry = Telemetry.__new__(Telemetry)  # without SGLANG_SPECSOT_STEP_LOG's log
    worker.telemetry.cost, worker.telemetry.timed, worker.telemetry.steps = model, False, 0
    worker.telemetry.step_log, worker.telemetry.device_times, worker.telemetry.trace = step_log, None, None
    worker.policy = StepPolicy(config, WINDOW, drafter.costs, log_candidates=step_log is not None)
    worker.planners = {worker.policy.name: worker.policy, **drafter.policies()}
    worker.agreement = SOLO  # one rank: times apply as measured
    worker.timings = TimingLedger(SOLO, model, worker.planners)
    worker.device_support, worker._trace, worker._loop_logged = device.NO_DEVICE_SUPPORT, None, True
    worker.verifier = EagerVerify(WINDOW, "a unit test's worker")
    worker.trimmer = MallocTrim(0.0)  # steps of a unit test never trim the test process's heap
    worker._pending = None
    return worker


def decide(worker: SpecSoTWorker, step) -> StepDecision:
    """The policy's decision for the decode batch `step`, as the worker's draft asks it."""
    return worker.policy.decide(worker.requests.view(step.reqs), worker.drafter.pricing(step))


def warm(policy: StepPolicy, role: str = "plain", key: str = "earlier") -> None:
    """The server has verified drafts of `role` on enough steps not to be cold for it (each
    missed both of its 2 drafts)."""
    for _ in range(policy.config.cold_verifies):
        policy.stats.observe(key, 2, 0, role)


def draft_model(max_steps: int = 4, topk: int = 1, **more) -> SimpleNamespace:
    """The few fields of SoTDraftModel the drafter reads: an adaptive chain of `max_steps`."""
    fields = dict(topk=topk, variable_steps=True, max_steps=max_steps, tree_size=1 + max_steps * topk,
                  runner_ups=None, keeps_confidence=True)  # fmt: skip
    return SimpleNamespace(**(fields | more))


def model_drafting(
    config: AdaptiveConfig, model=None, costs: CostModel | None = None, deferred: bool = True
) -> ModelDrafting:
    """A draft-model drafter on the CPU: its extends deferred on plain steps (the backlog) unless
    `deferred` is False. By default rows are free to 64 for both models; a draft forward costs
    40 ms, a target forward 100 ms, and a draft-extend of more than 64 rows 10 ms a row more."""
    drafter = ModelDrafting.__new__(ModelDrafting)
    if costs is None:
        costs = cost((1, 64), (100.0, 100.0))
        costs.draft = ForwardCost(probe_rows=(1, 64, 65), probe_ms=(40.0, 40.0, 50.0))
    drafter.config, drafter.cost, drafter.window, drafter.timed, drafter.device = config, costs, WINDOW, False, "cpu"
    drafter.model = model if model is not None else draft_model()
    drafter.context = ContextDrafting(RequestBook(), costs, adaptive=True)
    drafter.costs = ModelCosts(drafter)
    drafter.alone = None  # the context's own plan: test_model_drafting.py sets one where tested
    drafter.kind = DraftKind.MODEL
    drafter.topk_source, drafter.draft_int8, drafter.draft_model_skips = "extend", None, 0
    drafter.first_calibration = FirstDraftCalibration()
    drafter.long_match_stats = AcceptanceStats(config)
    drafter.chain_depths = [0] * drafter.model.max_steps
    drafter.runner_up_counts = {"steps": 0, "verified": 0, "accepted": 0}
    drafter.__dict__["takes_runner_ups"] = False
    backlog = ExtendBacklog()
    extend = DeferredExtend(drafter.model, costs, backlog, drafter.context.history, 256, "cpu", timed=False)
    drafter.__dict__["deferred"] = extend if deferred else None
    return drafter


def decoding(rids, max_new_tokens: int | None = None, output: int = 5) -> list[SimpleNamespace]:
    """Decoding requests; with `max_new_tokens`, `output` tokens written of it."""
    if max_new_tokens is None:
        return [SimpleNamespace(rid=rid) for rid in rids]
    params = SimpleNamespace(max_new_tokens=max_new_tokens)
    return [SimpleNamespace(rid=rid, output_ids=[1] * output, sampling_params=params) for rid in rids]


def batch(n: int, **fields) -> SimpleNamespace:
    """A decode batch of requests r0 .. r{n-1}."""
    return SimpleNamespace(reqs=decoding([f"r{i}" for i in range(n)]), **fields)


def decision(
    step, book: RequestBook | None = None, plan: StepPlan | None = None, ps=(), firsts=(), exploring=False
) -> StepDecision:
    """A step's decision as the policy would hand it (plain unless `plan`), for the stages after it."""
    view = (book or RequestBook()).view(step.reqs)
    bs = len(step.reqs)
    plan = plan if plan is not None else StepPlan(1, (0,) * bs, float(bs), 0.0)
    return StepDecision(view, plan, tuple(ps), tuple(firsts), exploring, adaptive=True)


def verified_step(seq_lens: list[int], rows: list[list[int]], accept_lens: list[int]):
    """A decode batch after verify: positions [seq_len, seq_len + k) of each request committed,
    `rows` the verify's tokens (row-major, n per request) and `k` of each accepted."""
    bs, n = len(rows), len(rows[0])
    pool = SimpleNamespace(req_to_token=torch.arange(2 * 128).view(2, 128))
    step = SimpleNamespace(
        reqs=decoding([f"r{i}" for i in range(bs)]), seq_lens=torch.tensor(seq_lens),
        req_pool_indices=torch.arange(bs), req_to_token_pool=pool,
    )  # fmt: skip
    result = SimpleNamespace(
        accept_lens=torch.tensor(accept_lens), next_token_ids=torch.tensor(rows).flatten(),
        speculative_num_draft_tokens=n, new_seq_lens=torch.tensor(seq_lens) + torch.tensor(accept_lens),
        next_draft_input=SimpleNamespace(topk_p=None, topk_index=None),
    )  # fmt: skip
    return step, result


def random_tree(rng: random.Random, n: int) -> DraftTree:
    """A random draft tree of at most `n` nodes in BFS order (parents before children), padded
    to `n` as the worker pads a step's trees."""
    size = rng.randrange(1, n + 1)
    parents = [-1] + [rng.randrange(i) for i in range(1, size)]
    depth = [0] * size
    for i in range(1, size):
        depth[i] = depth[parents[i]] + 1
    order = sorted(range(size), key=lambda i: (depth[i], i))
    new = {old: k for k, old in enumerate(order)}
    tree = DraftTree(
        tokens=tuple(rng.randrange(100) for _ in order),
        parents=tuple(-1 if o == 0 else new[parents[o]] for o in order),
    )
    return pad_tree(tree, n, filler=0)

