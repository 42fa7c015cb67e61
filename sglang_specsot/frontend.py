"""Skeleton-of-Thought as an SGLang frontend program: skeleton -> parse -> fork(n) -> join -> merge.

`answer_question` runs `sot_program` against any SGLang server (plain or SPECSOT) and returns
an `SoTAnswer`: the answer plus every phase with its times. The program has no control flow
of its own: it runs `sot.runner.run_sot`, the same phases as server-side SoT, through
`ProgramBackend`, which turns each generation into interpreter operations (`fork`, `gen`,
`join`) on the program's state. So both paths send the model the same prompts and budgets.

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

import asyncio
import concurrent.futures
import contextlib
import dataclasses

import sglang as sgl

from sglang_specsot.host.adapter import TaggingRuntimeEndpoint
from sglang_specsot.sot.quality_gate import with_configured_gate
from sglang_specsot.sot.router import ROUTERS
from sglang_specsot.sot.runner import (
    GenRequest,
    GenResult,
    Render,
    SoTAnswer,
    SoTOptions,
    new_group,
    route_phase,
    run_sot,
    shared_prefix,
)
from sglang_specsot.sot.tag import BRANCH, SKELETON

# The executor variable holding the GenRequest of the generation it runs next; forks copy it.
REQUEST_VAR = "__specsot_request__"
# A plain answer's budget when the caller sets none (a server's chat route would use the context).
DEFAULT_MAX_NEW_TOKENS = 1024


class SoTEndpoint(TaggingRuntimeEndpoint):
    """A RuntimeEndpoint that adds each generation's SoT tag (`sampling_params.custom_params`)
    and the skeleton's custom logit processor to its /generate body."""

    def extend_generate_body(self, state, body: dict) -> None:
        request: GenRequest | None = state.variables.get(REQUEST_VAR)
        params = body.get("sampling_params", {})
        if request is None or not params.get("max_new_tokens"):
            return  # a fork's prefix commit (max_new_tokens=0) generates nothing to tag
        params["custom_params"] = {**(params.get("custom_params") or {}), **request.tag.to_custom_params()}
        if request.logit_processor is not None:
            body["custom_logit_processor"] = request.logit_processor


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
    router: str = "classifier",
) -> SoTAnswer:
    """Answer one question with `sot_program`; `render` defaults to the server model's template
    (read from the server's model path, so the client must be able to load that tokenizer).

    `constrain_skeleton`: keep the skeleton in the numbered-points format with
    `skeleton_constraint` (unless `options` brings its own processor). None: when the server
    can run it (see `_with_skeleton_constraint`); True: always (an error if it cannot).
    `router`: in mode "auto", "classifier" (the default, as on the server: the hard rules,
    then the question classifier, loaded in this process) or "rules" (the rules alone).
    """
    render = render or chat_renderer(endpoint.get_model_name())
    options = _with_classifier(options, router)
    options = _with_skeleton_constraint(endpoint, question, options, constrain_skeleton)
    state = sot_program.run(
        question=question, render=render, options=options, group=group or new_group(),
        backend=endpoint, temperature=temperature, max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
    )  # fmt: skip
    return state.ret_value


def _with_classifier(options: SoTOptions, router: str) -> SoTOptions:
    if router not in ROUTERS:
        raise ValueError(f"router={router!r} is not one of {ROUTERS}")
    options = with_configured_gate(options)
    if router == "rules" or options.mode != "auto" or options.classifier is not None:
        return options
    from sglang_specsot.models.router_classifier import load_default_classifier

    return dataclasses.replace(options, classifier=load_default_classifier())


def _with_skeleton_constraint(
    endpoint: SoTEndpoint, question: str, options: SoTOptions, wanted: bool | None
) -> SoTOptions:
    """`options` with the skeleton constraint added where it is wanted and can run.

    By default (None) where server-side SoT adds it too (`constraint_runs`: processors
    enabled, and each request's current output in view). The client cannot see the server's
    SGLANG_ENABLE_DELAY_SAMPLE: pass True for a plain overlap server that sets it.
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
    from sglang_specsot.serving.skeleton_constraint import constraint_runs, skeleton_processor_for

    runs = constraint_runs(
        enable_custom_logit_processor=True,
        speculative_algorithm=info.get("speculative_algorithm"),
        disable_overlap_schedule=bool(info.get("disable_overlap_schedule")),
    )
    if wanted is None and not runs:
        return options
    processor = skeleton_processor_for(endpoint.get_model_name(), options.config)
    return dataclasses.replace(options, skeleton_logit_processor=processor)


@sgl.function
def sot_program(s, question: str, render: Render, options: SoTOptions, group: str) -> SoTAnswer:
    s.set_var(REQUEST_VAR, None)  # present in the root, so join() does not gather the forks' copies
    return _run_to_completion(run_sot(question, ProgramBackend(s), render, options, group=group))


def _run_to_completion(coroutine):
    """Run `coroutine` on a fresh event loop; in a thread when this one already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="specsot-sot") as pool:
        return pool.submit(asyncio.run, coroutine).result()


class ProgramBackend:
    """The runner's backend inside `sot_program`: generations as interpreter operations.

    The plain answer decodes in the root state; the skeleton in a `fork(1)` child, so the root
    holds no text until the branches' shared prefix; the branches in the forks that
    `fork_branches` makes after committing that prefix once. Interpreter calls block, so each
    runs in a worker thread; the interpreter's states are safe to use from several threads.
    """

    def __init__(self, state) -> None:
        self.state = state
        self.prefix = ""  # the branches' shared prompt prefix, committed once by fork_branches
        self.forks: dict[int, object] = {}  # skeleton index -> the branch's forked state
        self.asked: set[int] = set()  # skeleton indices whose fork has generated

    async def generate(self, request: GenRequest, on_text=None) -> GenResult:
        return await asyncio.to_thread(self._generate, request)

    def _generate(self, request: GenRequest) -> GenResult:
        if request.tag.role == SKELETON:
            return self._skeleton(request)
        if request.tag.role == BRANCH:
            assert request.prompt.startswith(self.prefix), "a branch prompt outside the committed prefix"
            if request.tag.point in self.asked:
                return self._retry(request)
            self.asked.add(request.tag.point)
            return _gen(self.forks[request.tag.point], request, "branch", request.prompt[len(self.prefix) :])
        return _gen(self.state, request, "answer", request.prompt)

    def _retry(self, request: GenRequest) -> GenResult:
        """A branch asked once more (runner.retry_request): its own fork holds the first
        answer, so the second runs in a new fork of the root, which holds the shared prefix."""
        forks = self.state.fork(1)
        try:
            return _gen(forks[0], request, "branch", request.prompt[len(self.prefix) :])
        finally:
            forks.join()

    def _skeleton(self, request: GenRequest) -> GenResult:
        forks = self.state.fork(1)
        try:
            return _gen(forks[0], request, "skeleton", request.prompt)
        finally:
            forks.join()

    @contextlib.asynccontextmanager
    async def fork_branches(self, requests: dict[int, GenRequest]):
        self.prefix = shared_prefix(r.prompt for r in requests.values())
        forks = await asyncio.to_thread(self._fork, len(requests))
        self.forks = dict(zip(sorted(requests), forks))
        try:
            yield
        finally:
            # Waits for branches still running after a failure (each bounded by its budget).
            await asyncio.to_thread(forks.join)

    def _fork(self, n: int):
        self.state += self.prefix
        # fork() tests the text for its prefix commit before it syncs (interpreter.py:375-377),
        # so without this sync the just-queued prefix looks empty and is never committed.
        self.state.sync()
        return self.state.fork(n)  # commits the shared prefix once, before any branch runs


def _gen(state, request: GenRequest, name: str, text: str) -> GenResult:
    """Append `text` and a gen to `state`, wait for it, and read its result; a failed request
    raises its error (the runner names the phase)."""
    state.set_var(REQUEST_VAR, request)  # read by SoTEndpoint when this gen is posted
    state += text + sgl.gen(name, max_tokens=request.max_new_tokens or DEFAULT_MAX_NEW_TOKENS)
    try:
        text = state[name]
    except KeyError:  # the executor stopped on an error before setting the variable
        error = state.error()
        raise error if isinstance(error, BaseException) else RuntimeError(error or "no output") from None
    meta = state.get_meta_info(name) or {}
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    return GenResult.from_meta(text, meta, finish)
