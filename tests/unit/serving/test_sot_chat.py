"""Server-side SoT's chat flow over a fake SGLang serving object: caps and errors as SGLang's
own route gives them, the total max_tokens cap, the limits, the gate and aborts."""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from types import SimpleNamespace

import pytest
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_specsot.serving import chat
from sglang_specsot.serving.chat import _SoTChat
from sglang_specsot.serving.field import parse_field, server_limits
from sglang_specsot.serving.gate import GroupGate
from sglang_specsot.sot.limits import SoTLimits

QUESTION = "What are the benefits of regular exercise?"
SKELETON = " Heart health\n2. Better mood\n3. Stronger muscles\n4. Better sleep"
CONTEXT = 2048


class _Tokenizer:
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text):
        return text.split()


LIST_ANSWER = "Here are some ways:\n1. "  # a normal answer that announces a list


class _TokenizerManager:
    """Answers every generation with words up to its max_new_tokens; a branch can be aborted."""

    incremental_streaming_output = False
    context_len = CONTEXT
    num_reserved_tokens = 0

    def __init__(self, abort: dict | None = None, abort_role: str = "branch", row_costs: dict | None = None,
                 plain: str = LIST_ANSWER) -> None:  # fmt: skip
        self.tokenizer = _Tokenizer()
        self.plain = plain  # the normal answer's opening; its list or prose decides mode "auto"
        self.server_args = SimpleNamespace(enable_custom_logit_processor=False)
        self.abort, self.abort_role = abort, abort_role  # the finish reason that role ends with
        self.requests: list[GenerateReqInput] = []
        self.row_costs = row_costs  # the scheduler's curve (None: its probe could not time the model)
        self.running = 0  # requests in the scheduler's running batch
        self.aborted: list[str] = []

    async def get_internal_state(self):
        return [{"specsot_row_costs": self.row_costs}]

    async def get_loads(self):
        return [SimpleNamespace(num_running_reqs=self.running, num_waiting_reqs=0, max_running_requests=64,
                                decode_moments=None)]  # fmt: skip

    async def generate_request(self, obj, raw_request=None):
        self.requests.append(obj)
        cap = obj.sampling_params.get("max_new_tokens")
        role = _role(obj.rid)
        # Distinct words, so the branch's loop watch never ends it early.
        filler = " ".join(f"w{i}" for i in range(5_000))
        words = (SKELETON if role == "skeleton" else self.plain + filler if role == "plain" else filler).split(" ")
        words = words[: cap or 50]
        finish = {"type": "length" if cap and len(words) == cap else "stop"}
        if role == self.abort_role and self.abort is not None:
            finish = self.abort
        # Streamed a word at a time (cumulative, as SGLang's default) when asked; an abort
        # ends the stream at the next word.
        for n in range(1, len(words) + 1) if obj.stream else [len(words)]:
            aborted = obj.rid in self.aborted
            done = n == len(words) or aborted
            ended = {"type": "abort", "message": "Abort"} if aborted else finish
            meta = {"prompt_tokens": 5, "completion_tokens": n, "finish_reason": ended if done else None}
            yield {"text": " ".join(words[:n]), "meta_info": meta}
            if done:
                return

    def abort_request(self, rid="", abort_all=False):
        self.aborted.append(rid)


def _role(rid: str) -> str:
    """The part a rid ("specsot-<group>-<role>-<n>") is for; a branch's role names its point
    ("branch3"), which this drops."""
    return rid.split("-")[2].rstrip("0123456789")


class _Serving:
    def __init__(self, tm: _TokenizerManager) -> None:
        self.tokenizer_manager = tm

    def _validate_request(self, request):
        return "Messages cannot be empty." if not request.messages else None

    def _convert_to_internal_request(self, request, raw_request=None):
        cap = request.max_completion_tokens or request.max_tokens
        params = {"temperature": 0.0, "max_new_tokens": cap}
        return GenerateReqInput(text=QUESTION, sampling_params=params, stream=request.stream), request

    def create_error_response(self, message, err_type="BadRequestError", status_code=400):
        return SimpleNamespace(status_code=status_code, type=err_type, message=message)

    def create_streaming_error_response(self, message, err_type="BadRequestError", status_code=400):
        return json.dumps({"error": {"message": message, "type": err_type, "code": status_code}})


async def _original(serving, request, raw_request):
    return SimpleNamespace(status_code=200, by="sglang", request=request)


def _answer(field: dict, limits: SoTLimits = SoTLimits(), tm: _TokenizerManager | None = None, **request):
    tm = tm or _TokenizerManager()
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], **request}
    parsed = parse_field(json.dumps({"specsot": field}).encode(), "off", limits)
    req = ChatCompletionRequest(**body)
    return asyncio.run(_SoTChat(_Serving(tm), req, None, parsed).respond(_original)), tm


@pytest.fixture(autouse=True)
def _fresh_gate(monkeypatch):
    monkeypatch.setattr(chat, "_gate", None)
    server_limits.cache_clear()
    yield
    server_limits.cache_clear()



@pytest.mark.parametrize("cap", [200, 300, 1000])
@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_caps_the_whole_sot_answer(key, cap):
    response, tm = _answer({"mode": "on", "config": {"max_branch_tokens": 384, "default_branch_tokens": 300}},
                           **{key: cap})  # fmt: skip
    assert response.metadata["specsot"]["path"] == "sot"
    assert response.usage.completion_tokens <= cap


def test_without_max_tokens_the_answer_is_capped_by_the_server_limit(monkeypatch):
    limits = SoTLimits(max_answer_tokens=250)
    monkeypatch.setattr(chat, "server_limits", lambda: limits)
    response, _ = _answer({"mode": "on"}, limits)
    assert response.metadata["specsot"]["path"] == "sot" and response.usage.completion_tokens <= 250


@pytest.mark.parametrize("cap", [0, -1])
def test_a_cap_of_zero_or_less_goes_to_sglang_as_it_came(cap):
    response, tm = _answer({"mode": "on"}, max_tokens=cap)
    assert response.by == "sglang" and tm.requests == []


def test_a_cap_beyond_the_context_gets_sglangs_own_context_length_answer():
    response, tm = _answer({"mode": "on"}, max_tokens=10**9)
    assert response.by == "sglang" and tm.requests == []
    response, _ = _answer({"mode": "on"}, max_tokens=CONTEXT - 10)
    assert response.metadata["specsot"]["path"] == "sot"


def test_a_cap_too_small_for_sot_is_answered_by_sglang_in_mode_on():
    response, tm = _answer({"mode": "on"}, max_tokens=16)
    assert response.by == "sglang" and response.request.max_tokens == 16


def test_empty_messages_get_sglangs_own_message():
    response, _ = _answer({"mode": "on"}, messages=[])
    assert (response.status_code, response.message) == (400, "Messages cannot be empty.")


def _prompts(tm: _TokenizerManager, role: str) -> list[str]:
    return [r.text for r in tm.requests if _role(r.rid) == role]


def test_mode_auto_reads_the_normal_answers_opening_and_answers_prose_normally():
    response, tm = _answer({"mode": "auto"}, max_tokens=300, tm=_TokenizerManager(plain=""))
    trace = response.metadata["specsot"]
    assert trace["path"] == "normal" and trace["opening"]["kind"] == "prose", trace
    assert trace["reason"] == "opening: no line break in the first 400 characters" and not trace["fallback"]
    assert len(_prompts(tm, "plain")) == 1 and not _prompts(tm, "branch")
    assert response.usage.completion_tokens == 300  # the normal answer's, to its cap


@pytest.mark.parametrize("role", ["system", "developer"])
def test_a_system_message_is_answered_by_sot_under_it(role):
    system = "Always answer in French."
    messages = [{"role": role, "content": system}, {"role": "user", "content": QUESTION}]
    response, tm = _answer({"mode": "auto"}, messages=messages, max_tokens=300)
    assert response.metadata["specsot"]["path"] == "sot", response.metadata
    prompts = _prompts(tm, "skeleton") + _prompts(tm, "branch") + _prompts(tm, "prefix")
    assert len(prompts) == 6 and all(system in p for p in prompts)
    assert len(_prompts(tm, "plain")) == 1  # the opening, read first (SGLang's own rendering of the chat)


def test_a_system_message_in_text_parts_counts_as_its_text():
    parts = [{"type": "text", "text": "Talk like "}, {"type": "text", "text": "a pirate."}]
    messages = [{"role": "system", "content": parts}, {"role": "user", "content": QUESTION}]
    response, tm = _answer({"mode": "on"}, messages=messages, max_tokens=300)
    assert response.metadata["specsot"]["path"] == "sot"
    assert "Talk like a pirate." in _prompts(tm, "skeleton")[0]


def test_a_system_message_that_asks_for_json_is_answered_normally_in_auto():
    messages = [{"role": "system", "content": "Reply in JSON."}, {"role": "user", "content": QUESTION}]
    response, tm = _answer({"mode": "auto"}, messages=messages)
    assert response.by == "sglang" and not tm.requests


@pytest.mark.parametrize(
    "messages",
    [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
      {"role": "user", "content": QUESTION}],
     [{"role": "system", "content": "Be kind."}, {"role": "system", "content": "Be brave."},
      {"role": "user", "content": QUESTION}],
     [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "1."}]],
    ids=["history", "two-system-messages", "assistant-last"],
)  # fmt: skip
def test_a_conversation_is_refused_in_on_and_answered_normally_in_auto(messages):
    refused, tm = _answer({"mode": "on"}, messages=messages)
    assert refused.status_code == 400 and "at most one system message (no history)" in refused.message
    normal, tm = _answer({"mode": "auto"}, messages=messages)
    assert normal.by == "sglang" and not tm.requests


def test_a_question_above_the_length_limit_is_refused_in_on_and_answered_normally_in_auto(monkeypatch):
    limits = SoTLimits(max_question_chars=10)
    monkeypatch.setattr(chat, "server_limits", lambda: limits)
    refused, _ = _answer({"mode": "on"}, limits)
    normal, _ = _answer({"mode": "auto"}, limits)
    assert refused.status_code == 400 and "max_question_chars=10" in refused.message
    assert normal.by == "sglang"


def test_a_full_gate_answers_429(monkeypatch):
    gate = GroupGate(running=1, waiting=0)
    monkeypatch.setattr(chat, "_gate", gate)

    async def scenario():
        async with gate.slot():
            req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": QUESTION}])
            field = parse_field(b'{"specsot": {"mode": "on"}}', "off")
            return await _SoTChat(_Serving(_TokenizerManager()), req, None, field).respond(_original)

    response = asyncio.run(scenario())
    assert response.status_code == 429 and "max_groups=1" in response.message


def test_a_graceful_abort_ends_a_non_streamed_answer_with_finish_reason_abort():
    response, _ = _answer({"mode": "on"}, tm=_TokenizerManager(abort={"type": "abort", "message": "Abort by user"}))
    assert response.choices[0].finish_reason == "abort"
    assert "Abort by user" in response.metadata["specsot"]["aborted"]


def test_an_abort_with_a_status_keeps_it():
    abort = {"type": "abort", "message": "Out of memory", "status_code": HTTPStatus.SERVICE_UNAVAILABLE}
    response, _ = _answer({"mode": "on"}, tm=_TokenizerManager(abort=abort))
    assert (response.status_code, response.type) == (503, "SERVICE_UNAVAILABLE")
    assert "Out of memory" in response.message


async def _collect(response) -> list[str]:
    return [chunk async for chunk in response.body_iterator]


@pytest.mark.parametrize("abort, ends", [
    ({"type": "abort", "message": "Abort by user"}, '"finish_reason":"abort"'),
    ({"type": "abort", "message": "Out of memory", "status_code": HTTPStatus.SERVICE_UNAVAILABLE},
     '"type": "SERVICE_UNAVAILABLE", "code": 503'),
])  # fmt: skip
def test_a_branch_aborted_mid_stream_ends_it_as_sglang_ends_its_own(abort, ends):
    async def scenario():
        req = ChatCompletionRequest(model="m", stream=True, messages=[{"role": "user", "content": QUESTION}])
        field = parse_field(b'{"specsot": {"mode": "on"}}', "off")
        response = await _SoTChat(_Serving(_TokenizerManager(abort=abort)), req, None, field).respond(_original)
        return await _collect(response)

    chunks = asyncio.run(scenario())
    assert "reasoning_content" in chunks[1]  # the skeleton was already sent
    assert ends in chunks[-2] and chunks[-1] == "data: [DONE]\n\n"
    assert not any('"code": 400' in c for c in chunks)


def test_a_skeleton_aborted_before_its_first_token_still_streams_the_abort_ending():
    async def scenario():
        req = ChatCompletionRequest(model="m", stream=True, messages=[{"role": "user", "content": QUESTION}])
        field = parse_field(b'{"specsot": {"mode": "on"}}', "off")
        tm = _TokenizerManager(abort={"type": "abort", "message": "Abort by user"}, abort_role="skeleton")
        response = await _SoTChat(_Serving(tm), req, None, field).respond(_original)
        return await _collect(response)

    chunks = asyncio.run(scenario())
    assert '"role":"assistant"' in chunks[0] and '"finish_reason":"abort"' in chunks[-2]
    assert chunks[-1] == "data: [DONE]\n\n" and not any('"error"' in c for c in chunks)


# -- mode "auto" under load: SoT only where a slot is free now ------------------------------


async def _chat_completion(serving, request, raw_request):
    """SGLang's handler answering with a chat completion (which the route annotates)."""
    return SimpleNamespace(by="sglang", choices=[], metadata=None)


def _respond(tm: _TokenizerManager, mode: str, **request):
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": QUESTION}], **request)
    field = parse_field(json.dumps({"specsot": {"mode": mode}}).encode(), "off")
    return _SoTChat(_Serving(tm), req, None, field).respond(_chat_completion)


def test_in_mode_auto_a_busy_server_answers_normally_at_once(monkeypatch):
    gate = GroupGate(running=1, waiting=4)
    monkeypatch.setattr(chat, "_gate", gate)
    tm = _TokenizerManager()

    async def scenario(mode: str):
        async with gate.slot():  # another SoT answer holds the only slot
            task = asyncio.ensure_future(_respond(tm, mode))
            for _ in range(50):
                await asyncio.sleep(0.001)
            return task.done() and task.result()

    answered = asyncio.run(scenario("auto"))
    assert answered.by == "sglang" and answered.metadata["specsot"]["route"]["rule"] == "busy"
    assert "max_groups" in answered.metadata["specsot"]["reason"] and tm.requests == []
    # Mode "on" asked for SoT: it waits for the slot instead.
    assert asyncio.run(scenario("on")) is False


def test_in_mode_auto_a_free_slot_still_gives_sot(monkeypatch):
    monkeypatch.setattr(chat, "_gate", GroupGate(running=2, waiting=4))
    response, _ = _answer({"mode": "auto"})
    assert response.metadata["specsot"]["path"] == "sot"


class _HeldTokenizerManager(_TokenizerManager):
    """Generations wait for `go`, so SoT answers hold their slots while others arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def generate_request(self, obj, raw_request=None):
        await self.go.wait()
        async for out in super().generate_request(obj, raw_request):
            yield out


def test_a_burst_of_auto_requests_sends_to_sot_only_as_many_as_there_are_slots(monkeypatch):
    gate = GroupGate(running=2, waiting=8)
    monkeypatch.setattr(chat, "_gate", gate)

    async def scenario():
        tm = _HeldTokenizerManager()
        tasks = [asyncio.ensure_future(_respond(tm, "auto")) for _ in range(6)]
        for _ in range(200):
            if sum(t.done() for t in tasks) == 4:
                break
            await asyncio.sleep(0.005)
        normal = [t.result() for t in tasks if t.done()]
        tm.go.set()
        answers = await asyncio.gather(*tasks)
        return normal, answers

    normal, answers = asyncio.run(scenario())
    assert len(normal) == 4 and all(r.metadata["specsot"]["route"]["rule"] == "busy" for r in normal)
    assert sum(getattr(r, "by", None) != "sglang" for r in answers) == 2
    assert gate.active == 0 and gate.queued == 0


def test_a_request_that_leaves_sot_before_its_answer_starts_gives_its_slot_back(monkeypatch):
    gate = GroupGate(running=1, waiting=1)
    monkeypatch.setattr(chat, "_gate", gate)

    async def scenario():
        # Past the context: SGLang's own handler answers (its context-length error) after
        # the route reserved the slot.
        first = await _respond(_TokenizerManager(), "auto", max_tokens=10**9)
        return first, await gate.reserve()

    first, reservation = asyncio.run(scenario())
    assert first.by == "sglang" and reservation is not None


# -- mode "auto" priced by the server's row costs (sot/latency.py) ---------------------------------

LINEAR = {"probe_rows": [1, 4, 8], "probe_ms": [197.0, 677.0, 1355.0], "overhead_ms": 0.0, "observed_steps": 0}
CHEAP = {"probe_rows": [1, 8, 64], "probe_ms": [174.0, 177.0, 285.0], "overhead_ms": 134.0, "observed_steps": 0}


def test_in_mode_auto_linear_row_costs_answer_normally_with_the_numbers_in_the_metadata():
    response = asyncio.run(_respond(_TokenizerManager(row_costs=LINEAR), "auto"))
    trace = response.metadata["specsot"]
    assert response.by == "sglang" and trace["route"]["rule"] == "latency" and trace["reason"].startswith("a normal")
    latency = trace["route"]["latency"]
    assert latency["use_sot"] is False and latency["sot_ms"] > latency["normal_ms"] > 0
    assert latency["curve"] == "start-up probe" and latency["running"] == 0 and latency["margin"] == 0.15


def test_in_mode_auto_cheap_rows_give_sot_and_it_steps_aside_as_the_batch_grows():
    tm = _TokenizerManager(row_costs=CHEAP)
    sot = asyncio.run(_respond(tm, "auto", max_tokens=400))
    latency = sot.metadata["specsot"]["route"]["latency"]
    assert sot.metadata["specsot"]["path"] == "sot" and latency["use_sot"] and latency["ratio"] < 0.85
    tm.running = 63
    busy = asyncio.run(_respond(tm, "auto", max_tokens=400))
    assert busy.by == "sglang" and busy.metadata["specsot"]["route"]["latency"]["running"] == 63
    tm.running = 0
    assert asyncio.run(_respond(tm, "auto", max_tokens=400)).metadata["specsot"]["path"] == "sot"


def test_without_a_curve_auto_keeps_the_routers_choice_and_says_why():
    response = asyncio.run(_respond(_TokenizerManager(row_costs=None), "auto"))
    latency = response.metadata["specsot"]["route"]["latency"]
    assert response.metadata["specsot"]["path"] == "sot" and latency["curve"] == "unknown"
    assert "probe could not time" in latency["reason"]


def test_mode_on_is_not_priced():
    response, _ = _answer({"mode": "on"}, tm=_TokenizerManager(row_costs=LINEAR))
    assert response.metadata["specsot"]["path"] == "sot" and "latency" not in response.metadata["specsot"]["route"]


def test_the_server_learns_the_lengths_it_prices_by():
    from sglang_specsot.serving.costs import server_costs

    tm = _TokenizerManager(row_costs=CHEAP)
    asyncio.run(_respond(tm, "auto", max_tokens=400))
    assert server_costs(tm).book.info()["seen"] == {"normal": 0, "sot": 1}
    assert server_costs(tm).book.info()["median_points"] == 4

    async def with_usage(serving, request, raw_request):
        return SimpleNamespace(by="sglang", choices=[], metadata=None, usage=SimpleNamespace(completion_tokens=77))

    tm = _TokenizerManager(row_costs=LINEAR)  # priced normal: its length is what SoT must beat
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": QUESTION}])
    field = parse_field(b'{"specsot": {"mode": "auto"}}', "off")
    asyncio.run(_SoTChat(_Serving(tm), req, None, field).respond(with_usage))
    assert server_costs(tm).book.info()["seen"]["normal"] == 1
    assert server_costs(tm).book.info()["median_normal_tokens"] == 77
