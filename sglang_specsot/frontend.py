"""Skeleton-of-Thought as an SGLang frontend program: skeleton -> parse -> fork(n) -> join -> merge.

`answer_question` runs `sot_program` against any SGLang server (plain or SPECSOT) and returns
an `SoTAnswer`: the answer plus every phase with its times. Prompts, budgets and tags come
from `sot.runner`, so the server-side SoT sends the model exactly the same requests.

Frontend pitfalls handled here:
- the root state holds no text when the skeleton is generated, so the skeleton runs in a
  `fork(1)` child (a fork of size 1 commits nothing; interpreter.py:375) and the root stays
  free for the branches' shared prefix;
- `fork(n)` checks for text to commit before it waits for queued text, so the root is
  synced before forking, or the shared prefix would silently never be committed;
- `join()` uses the default "gather_variable" mode: `join("concate_and_append")` posts to
  /concate_and_append_request, which 0.5.23's HTTP server does not have;
- `SglSamplingParams.to_srt_kwargs` drops `custom_params` (ir.py:121-138), so `SoTEndpoint`
  adds the tags to each /generate body itself.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

import sglang as sgl
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

from sglang_specsot.sot.planner import BranchPlan, plan_branches
from sglang_specsot.sot.runner import (
    NORMAL,
    SOT,
    BranchesPhase,
    BranchResult,
    GenRequest,
    GenResult,
    NormalPhase,
    Render,
    SkeletonPhase,
    SoTAnswer,
    SoTOptions,
    SoTPhaseError,
    assemble_answer,
    branch_requests,
    merge_phase,
    new_group,
    parse_phase,
    plain_request,
    route_phase,
    shared_prefix,
    skeleton_request,
)

# The executor variable holding the GenRequest of the generation it runs next; forks copy it.
REQUEST_VAR = "__specsot_request__"
# A plain answer's budget when the caller sets none (a server's chat route would use the context).
DEFAULT_MAX_NEW_TOKENS = 1024


class SoTEndpoint(RuntimeEndpoint):
    """A RuntimeEndpoint that adds each generation's SoT tag (`sampling_params.custom_params`)
    and the skeleton's custom logit processor to its /generate body."""

    def _add_images(self, s, data):
        # RuntimeEndpoint builds every /generate body inline and passes the finished body
        # through this one method just before posting it (runtime_endpoint.py:157-230), so
        # extending it tags generations without copying generate() and generate_stream().
        super()._add_images(s, data)
        request: GenRequest | None = s.variables.get(REQUEST_VAR)
        params = data.get("sampling_params", {})
        if request is None or not params.get("max_new_tokens"):
            return  # a fork's prefix commit (max_new_tokens=0) generates nothing to tag
        params["custom_params"] = {**(params.get("custom_params") or {}), **request.tag.custom_params()}
        if request.logit_processor is not None:
            data["custom_logit_processor"] = request.logit_processor


def chat_renderer(tokenizer_path: str) -> Render:
    """Render chat messages with the model's own chat template, generation prompt added."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    def render(messages: list[dict[str, str]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    return render


def answer_question(
    endpoint: SoTEndpoint,
    question: str,
    render: Render | None = None,
    options: SoTOptions = SoTOptions(),
    *,
    temperature: float = 0.0,
    group: str | None = None,
    constrain_skeleton: bool | None = None,
) -> SoTAnswer:
    """Answer one question with `sot_program`; `render` defaults to the server model's template
    (read from the server's model path, so the client must be able to load that tokenizer).

    `constrain_skeleton`: keep the skeleton in the numbered-points format with
    `skeleton_constraint` (unless `options` brings its own processor). None: when the server
    can run it (see `_with_skeleton_constraint`); True: always (an error if it cannot).
    """
    render = render or chat_renderer(endpoint.get_model_name())
    options = _with_skeleton_constraint(endpoint, question, options, constrain_skeleton)
    state = sot_program.run(
        question=question, render=render, options=options, group=group or new_group(),
        backend=endpoint, temperature=temperature, max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
    )  # fmt: skip
    return state.ret_value


def _with_skeleton_constraint(
    endpoint: SoTEndpoint, question: str, options: SoTOptions, wanted: bool | None
) -> SoTOptions:
    """`options` with the skeleton constraint added where it is wanted and can run.

    By default (None) only on a server started with --enable-custom-logit-processor whose
    processors see each request's current output: SPECSOT (verify hands them every tree
    node's history), or overlap scheduling off. SGLang's plain overlap scheduler samples
    before the previous token reaches `req.output_ids` (tp_worker.py:718-745), which would
    put the format one token behind; pass True there if SGLANG_ENABLE_DELAY_SAMPLE=1 is set.
    """
    if wanted is False or options.skeleton_logit_processor is not None:
        return options
    if not route_phase(question, options).decision.use_sot:
        return options  # no skeleton to constrain: spare the /server_info round trip
    info = endpoint.get_server_info()
    if not info.get("enable_custom_logit_processor"):
        if wanted:
            raise ValueError(
                "constrain_skeleton=True needs a server that runs custom logit processors; "
                "start it with --enable-custom-logit-processor"
            )
        return options
    current = info.get("disable_overlap_schedule") or info.get("speculative_algorithm") == "SPECSOT"
    if wanted is None and not current:
        return options
    from sglang_specsot.serving.skeleton_constraint import skeleton_processor_for

    processor = skeleton_processor_for(endpoint.get_model_name(), options.config)
    return dataclasses.replace(options, skeleton_logit_processor=processor)


@sgl.function
def sot_program(s, question: str, render: Render, options: SoTOptions, group: str) -> SoTAnswer:
    started = time.perf_counter()
    s.set_var(REQUEST_VAR, None)  # present in the root, so join() does not gather the forks' copies
    route = route_phase(question, options)
    if not route.decision.use_sot:
        normal = _normal(s, plain_request(question, render, options, group))
        return assemble_answer(group, NORMAL, route.decision.reason, route, started, normal=normal)
    skeleton = _skeleton(s, skeleton_request(question, render, options, group), options)
    if not skeleton.parse.is_plan:
        normal = _normal(s, plain_request(question, render, options, group))
        reason = f"skeleton {skeleton.parse.outcome}: {skeleton.parse.reason}"
        return assemble_answer(group, NORMAL, reason, route, started, skeleton=skeleton, normal=normal)
    plan = plan_branches(skeleton.parse, options.config)
    branches = _branches(s, plan, branch_requests(question, plan, render, options, group))
    merge = merge_phase(branches)
    return assemble_answer(group, SOT, route.decision.reason, route, started, skeleton, branches, merge)


def _submit(state, request: GenRequest, name: str, text: str) -> None:
    state.set_var(REQUEST_VAR, request)  # read by SoTEndpoint when this gen is posted
    max_tokens = request.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    state += text + sgl.gen(name, max_tokens=max_tokens)


def _collect(state, name: str, phase: str) -> GenResult:
    """Wait for a gen and read its result; a failed request raises SoTPhaseError."""
    try:
        text = state[name]
    except KeyError:  # the executor stopped on an error before setting the variable
        raise SoTPhaseError(phase, state.error() or RuntimeError("no output")) from None
    meta = state.get_meta_info(name) or {}
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    return GenResult(text, meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0), finish)


def _normal(s, request: GenRequest) -> NormalPhase:
    started = time.perf_counter()
    _submit(s, request, "answer", request.prompt)  # the root holds no text yet
    result = _collect(s, "answer", "normal answer")
    return NormalPhase(request, result, time.perf_counter() - started)


def _skeleton(s, request: GenRequest, options: SoTOptions) -> SkeletonPhase:
    forks = s.fork(1)
    started = time.perf_counter()
    try:
        _submit(forks[0], request, "skeleton", request.prompt)
        result = _collect(forks[0], "skeleton", "skeleton")
    finally:
        forks.join()
    return parse_phase(request, result, time.perf_counter() - started, options.config)


def _branches(s, plan: BranchPlan, requests: dict[int, GenRequest]) -> BranchesPhase:
    """Fork one state per point; keep at most `plan.max_running` generating, starting waiting
    ones (longest first) as others finish."""
    prefix = shared_prefix(r.prompt for r in requests.values())
    s += prefix
    # fork() tests the text for its prefix commit before it syncs (interpreter.py:375-377),
    # so without this sync the just-queued prefix looks empty and is never committed.
    s.sync()
    forks = s.fork(len(requests))  # commits the shared prefix once, before any branch runs
    finished: queue.Queue[tuple[int, GenResult | BaseException]] = queue.Queue()
    scheduler = plan.scheduler()
    running: set[int] = set()
    started_at: dict[int, float] = {}
    done: dict[int, BranchResult] = {}
    order: list[int] = []
    peak, started = 0, time.perf_counter()
    try:
        while not scheduler.is_done(done):
            for branch in scheduler.next_to_start(running, done):
                request = requests[branch.index]
                _submit(forks[branch.index], request, "branch", request.prompt[len(prefix) :])
                _watch(forks[branch.index], branch.index, finished)
                running.add(branch.index)
                order.append(branch.index)
                started_at[branch.index] = time.perf_counter() - started
            peak = max(peak, len(running))
            index, outcome = finished.get()
            running.discard(index)
            if isinstance(outcome, BaseException):
                raise outcome
            done[index] = BranchResult(
                index, plan.points[index], requests[index], outcome,
                started_at[index], time.perf_counter() - started,
            )  # fmt: skip
    finally:
        forks.join()  # waits for branches still running (each bounded by its budget)
    results = tuple(done[i] for i in sorted(done))
    return BranchesPhase(plan, results, tuple(order), peak, time.perf_counter() - started)


def _watch(state, index: int, finished: queue.Queue) -> None:
    """Report the branch's result (or error) on `finished` when its gen completes."""

    def wait() -> None:
        try:
            finished.put((index, _collect(state, "branch", f"branch {index + 1}")))
        except BaseException as exc:  # handed to the program's thread, which raises it
            finished.put((index, exc))

    threading.Thread(target=wait, name=f"specsot-branch-{index}", daemon=True).start()
