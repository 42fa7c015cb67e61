"""Requests SGLang's scheduler cannot run, refused where SGLang validates each request.

SGLang's TokenizerManager checks every request, single or one of a batch, in
`_validate_one_request` (tokenizer_manager.py:1307, called at :1271 and :1711), and its HTTP
routes answer that method's ValueError with a 400 (http_server.py:957, :988). Two kinds of
request pass it and then kill the scheduler, and the whole server with it:

- a text of 0 tokens (`"text": ""` with a tokenizer that adds no BOS): a forward pass over no
  token; on CPU it dies in the rotary embedding (rotary_embedding/base.py:347). SGLang refuses
  an empty `input_ids` itself, unless a session supplies the prompt (io_struct.py:490-499);
- a `custom_logit_processor` that does not deserialize: the scheduler runs
  `CustomLogitProcessor.from_str` when it builds the batch (sampling_batch_info.py:258) and dies
  in custom_logit_processor.py:20.

Server-side SoT sends its generations, and with them the `specsot.skeleton_logit_processor`
field, through `TokenizerManager.generate_request` (serving/backend.py), so this one check
covers SGLang's routes and ours. Host change "reject-unservable-requests" runs it after
SGLang's own checks.
"""

from __future__ import annotations

import functools

from sglang_specsot.host import adapter as sgl

_MAX_REASON = 200  # characters of the deserializer's own error quoted back to the client


def check_input_not_empty(obj, input_ids: list[int] | None) -> None:
    """ValueError when the request has no input token to run a forward pass over."""
    # input_ids is None when the prompt comes as input_embeds; a multimodal processor may
    # supply the tokens of an empty text itself (tokenizer_manager.py:1140-1143), and a
    # session its whole prompt (io_struct.py:490-499; the scheduler checks it once rebuilt).
    if input_ids is None or len(input_ids) > 0 or obj.contains_mm_input() or _continues_session(obj):
        return
    raise ValueError(
        "The input is empty (0 tokens): generation needs at least one input token. "
        "Send a non-empty `text` (this model's tokenizer adds no BOS token) or `input_ids`."
    )


def _continues_session(obj) -> bool:
    params = getattr(obj, "session_params", None)  # generation requests only
    return isinstance(params, dict) and bool(params.get("id"))


def check_custom_logit_processor(serialized: object) -> None:
    """ValueError unless `serialized` deserializes as the scheduler will deserialize it."""
    try:
        # Only strings are cached: any other JSON value fails as the scheduler would fail it.
        _deserialize(serialized) if isinstance(serialized, str) else sgl.CustomLogitProcessor.from_str(serialized)
    # orjson, bytes.fromhex, dill and the processor's constructor each raise their own
    # types for a malformed value; any of them would be raised in the scheduler instead.
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"[:_MAX_REASON]
        shown = repr(serialized)[:60]
        raise ValueError(
            f"custom_logit_processor {shown} is not a serialized CustomLogitProcessor ({reason}). "
            "Send the string returned by YourProcessor.to_str(), where YourProcessor subclasses "
            "sglang.srt.sampling.custom_logit_processor.CustomLogitProcessor."
        ) from exc


@functools.lru_cache(maxsize=64)
def _deserialize(serialized: str) -> None:
    # Server-side SoT sends the same default skeleton processor with every request, and the
    # chat route checks a client's before this hook does: a string that deserialized once
    # need not be unpickled again. Failures raise, so lru_cache never keeps them.
    sgl.CustomLogitProcessor.from_str(serialized)


def check_servable(obj, input_ids: list[int] | None) -> None:
    """Refuse what would kill the scheduler; run after SGLang's own checks of `obj`."""
    check_input_not_empty(obj, input_ids)
    processor = getattr(obj, "custom_logit_processor", None)  # generation requests only
    # Reached only when the server has --enable-custom-logit-processor: without it SGLang's
    # own check, which runs first, already refused a request that carries a processor
    # (tokenizer_manager.py:1412-1419). Deserializing runs the client's dill payload in this
    # process, which that flag already allows in the scheduler (and SGLang itself does here
    # for return_sampling_mask, custom_logit_processor.py:66).
    if processor:
        check_custom_logit_processor(processor)


def validate_one_request_after(result, tokenizer_manager, obj, input_ids=None):
    """AFTER hook on TokenizerManager._validate_one_request(obj, input_ids)."""
    check_servable(obj, input_ids)
    return result
