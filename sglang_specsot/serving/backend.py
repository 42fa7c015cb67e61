"""The SoT runner's generations, run through SGLang's TokenizerManager as /generate would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from sglang_specsot.host import adapter as sgl
from sglang_specsot.serving.dp_placement import place_answer
from sglang_specsot.serving.priority import branch_priority
from sglang_specsot.sot.finish import AimWatch
from sglang_specsot.sot.loops import LoopWatch
from sglang_specsot.sot.opening import OpeningWatch
from sglang_specsot.sot.phases import GenerationAborted, SoTPhaseError
from sglang_specsot.sot.runner import GenRequest, GenResult, shared_prefix
from sglang_specsot.sot.tag import BRANCH, PLAIN, SKELETON


class TokenizerManagerBackend:
    """Runs GenRequests through SGLang's TokenizerManager, as /generate would.

    Sampling settings are the chat request's own (SGLang's conversion, so defaults and stop
    strings match a normal answer); only the budget and the SoT tag differ per generation.
    The raw request goes along so SGLang aborts generations whose client disconnected, and
    cancelling a generation aborts it in the scheduler (tokenizer_manager.py:952-962). A
    request with `stop_on_loop` streams internally and is aborted once its text loops; one
    with `end_after` once a sentence ends past its aim; one with `read_opening` once its first
    line announces a list (sot.opening).
    """

    watches_text = True  # it can end a generation on what its text says (sot.runner reads it)

    def __init__(self, tokenizer_manager, chat_input, raw_request, group: str) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.chat_input = chat_input  # SGLang's GenerateReqInput for the whole chat request
        self.raw_request = raw_request
        self.group = group
        self.count = 0
        # Where the server schedules by priority, an admitted answer's branches run ahead of
        # later requests (serving/priority.py); None leaves SGLang's order alone.
        enabled, default, low_first = sgl.priority_settings(tokenizer_manager)
        self.branch_priority = branch_priority(enabled, chat_input.priority, default, low_first)
        # On a server with --dp-size > 1, the ranks of the skeleton and of each branch; a client's
        # own routed_dp_rank keeps the whole answer on that rank.
        self.placement = place_answer(sgl.dp_size(tokenizer_manager), chat_input.routed_dp_rank)

    async def generate(self, request: GenRequest, on_text: Callable[[str], None] | None = None) -> GenResult:
        watch = LoopWatch() if request.stop_on_loop else None
        aim = AimWatch(request.end_after) if request.end_after else None
        opening = OpeningWatch(request.read_opening) if request.read_opening else None
        watched = watch is not None or aim is not None or opening is not None
        obj = self._input(request, stream=on_text is not None or watched)
        incremental = sgl.incremental_streaming_output(self.tokenizer_manager)
        text, last, ended, keep = "", None, "", None
        async for out in self.tokenizer_manager.generate_request(obj, self.raw_request):
            piece = out["text"] if incremental and obj.stream else out["text"][len(text) :]
            text += piece
            last = out
            if ended:  # tokens decoded before the abort took hold: not part of the answer
                continue
            if on_text is not None and piece:
                on_text(piece)
            if watch is not None and watch.feed(piece):
                ended = "loop"
            elif aim is not None:
                keep = aim.feed(piece, out["meta_info"].get("completion_tokens", 0))
                ended = "aim" if keep is not None else ""
            if not ended and opening is not None:
                verdict = opening.feed(piece)
                if verdict is not None and verdict.has_points:
                    ended, keep = "opening", verdict.keep
            if ended:
                # End it in the scheduler; the stream still delivers the tokens already
                # decoded, then the abort, which here is our own ending, not an error.
                self.tokenizer_manager.abort_request(obj.rid)
        result = _ended(text, last["meta_info"], ended, keep)
        return replace(result, dp_rank=obj.routed_dp_rank) if request.tag.role != PLAIN else result

    @contextlib.asynccontextmanager
    async def fork_branches(self, requests: dict[int, GenRequest]) -> AsyncIterator[None]:
        """Prefill the branches' shared prompt (question and skeleton) once, then run them.

        The radix cache shares only what is cached when a request is scheduled, so branches
        admitted together would each prefill the whole prompt again. The commit is SGLang's
        own idiom, the frontend's `fork`: the prefix with `max_new_tokens=0`, whose KV the
        radix cache then keeps for every branch. On a server with several DP ranks the prefix
        is committed, in parallel, on every rank that runs a branch (serving/dp_placement.py).
        """
        prefix = shared_prefix(r.prompt for r in requests.values())
        if prefix and len(requests) > 1:
            ranks = self.placement.commit_ranks([r.tag.point for r in requests.values()])
            await asyncio.gather(*(self._commit(prefix, rank) for rank in ranks))
        yield

    async def _commit(self, prefix: str, rank: int | None) -> None:
        # Nothing is generated, so none of the chat's settings (stop strings, a grammar to
        # compile) apply; untagged, so the SPECSOT drafter treats it as no branch.
        obj = sgl.GenerateReqInput(
            text=prefix, sampling_params={"max_new_tokens": 0}, stream=False,
            rid=self._rid("prefix"), lora_path=self.chat_input.lora_path, priority=self.branch_priority,
            routed_dp_rank=rank,
        )  # fmt: skip
        try:
            async for out in self.tokenizer_manager.generate_request(obj, self.raw_request):
                _result("", out["meta_info"])  # raises on an abort, as a branch would
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # answered like a failed branch: same statuses, same abort
            raise SoTPhaseError("branches' shared prefix", exc) from exc

    def _rid(self, role: str) -> str:
        """A new rid for one generation of this answer: "specsot-<group>-<role>-<n>", where a
        branch's role names its point ("branch3": the skeleton's 0-based point 3), so a
        SGLANG_SPECSOT_TRACE line says which part of which answer it is."""
        self.count += 1
        return f"specsot-{self.group}-{role}-{self.count}"

    def _input(self, request: GenRequest, stream: bool):
        role = request.tag.role
        rid = self._rid(f"{role}{request.tag.point}" if role == BRANCH else role)
        params = self._sampling_params(request)
        if request.tag.role == PLAIN:  # SGLang's own rendering and tokenization of the chat
            return replace(self.chat_input, rid=rid, stream=stream, sampling_params=params)
        skeleton = request.tag.role == SKELETON
        priority = self.chat_input.priority if skeleton else self.branch_priority
        rank = self.placement.branch_rank(request.tag.point) if request.tag.role == BRANCH else self.placement.home
        return sgl.GenerateReqInput(
            text=request.prompt, sampling_params=params, stream=stream, rid=rid,
            custom_logit_processor=request.logit_processor, lora_path=self.chat_input.lora_path,
            priority=priority, routed_dp_rank=rank,
        )  # fmt: skip

    def _sampling_params(self, request: GenRequest) -> dict:
        params = dict(self.chat_input.sampling_params or {})
        if request.tag.role != PLAIN:
            # ignore_eos (bench_serving sends it by default) asks for exactly max_tokens of one
            # generation; under SoT it would run the skeleton past its end and every branch to
            # its budget. The skeleton decides the answer's length, so SoT's own generations
            # end at EOS; the normal answer, when SoT falls back, keeps the client's setting.
            params.pop("ignore_eos", None)
        if request.max_new_tokens is not None:
            params["max_new_tokens"] = self._within_context(request)
        params["custom_params"] = {**(params.get("custom_params") or {}), **request.tag.to_custom_params()}
        return params

    def _within_context(self, request: GenRequest) -> int:
        """The generation's budget, cut to what the context leaves after its prompt.

        A branch prompt repeats the question and the whole skeleton, so a question that fits
        the context with room for a skeleton can leave a branch less than its budget; SGLang
        would refuse that branch (tokenizer_manager.py:1353-1377) after the skeleton had been
        streamed. The budget is clamped instead (the branch then ends as "budget"). So is the
        normal answer a skeleton that is no plan falls back to: a client's own cap was checked
        against the context before SoT began (chat._beyond_context), so only a budget the
        server chose is cut, to what SGLang gives a request without max_tokens. A prompt with
        no room at all is still SGLang's refusal: there is nothing to answer with."""
        budget = request.max_new_tokens
        room = sgl.request_token_room(self.tokenizer_manager)
        # A byte-level BPE never makes more tokens than UTF-8 bytes (+ a few specials), so
        # most prompts are shown to fit without tokenizing them a second time.
        if len(request.prompt.encode()) + _SPECIAL_TOKENS + budget <= room:
            return budget
        prompt_tokens = len(self.tokenizer_manager.tokenizer.encode(request.prompt))
        return max(1, min(budget, room - prompt_tokens))


_SPECIAL_TOKENS = 8  # BOS and the like the tokenizer may add to a prompt


def _ended(text: str, meta: dict, ended: str, keep: int | None) -> GenResult:
    """The result of a generation we may have ended ourselves: at a loop (all its text; the
    merge cuts the loop), at the sentence that ended past its aim (the text up to it), or at
    a first line that announced a list (the intro line)."""
    if ended == "loop":
        return GenResult.from_meta(text, meta, "loop")
    if ended in ("aim", "opening"):
        return GenResult.from_meta(text[:keep], meta, ended)
    return _result(text, meta)


def _result(text: str, meta: dict) -> GenResult:
    finish = meta.get("finish_reason") or {}
    if finish.get("type") == "abort":
        raise _abort_error(finish)
    return GenResult.from_meta(text, meta, finish.get("type", "stop"))


def _abort_error(finish: dict) -> Exception:
    """SGLang's reading of an abort: a 400 is bad input (ValueError, as its non-streamed
    route raises, tokenizer_manager.py:1917); any other is the server's, not the client's."""
    message = finish.get("message") or "the generation was aborted"
    status = finish.get("status_code")
    if status is not None and int(status) == 400:
        return ValueError(message)
    return GenerationAborted(message, None if status is None else int(status))
