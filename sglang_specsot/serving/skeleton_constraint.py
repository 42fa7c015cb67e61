"""The skeleton constraint: an SGLang `CustomLogitProcessor` that keeps a skeleton in the
numbered-points format of `sot.skeleton_format`.

SGLang calls a processor with a batch of logits rows and one `custom_params` dict per row
(sampler.py:1019-1068); the dict holds `"__req__"`, a proxy of the request, when the request
sent any `custom_params` dict (schedule_batch.py:1148-1156). The processor reads the
request's `output_ids`, runs the format over their text and masks every token whose text is
not allowed next. SGLang builds the processor with no arguments (custom_logit_processor.py:
45-48), so its settings live on a subclass made by `skeleton_processor_for`; the vocabulary
classes, masks and format states are cached per process.

The processor needs the current history: SGLang's plain overlap scheduler hands processors
`output_ids` one token short (the forward samples before the previous result is processed;
tp_worker.py:718-745), so use a SPECSOT server, `--disable-overlap-schedule`, or
SGLANG_ENABLE_DELAY_SAMPLE=1 with a plain server. In a server where that does not hold, the
processor leaves logits alone and logs why once: a mask built from a stale history garbles
the skeleton ("1. TCP is connection-oriented\n22." on a plain CPU server), where an
unconstrained skeleton is usually still a plan and is parsed like any other.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.prompts import SKELETON_PREFILL
from sglang_specsot.sot.runner import SoTOptions
from sglang_specsot.sot.skeleton_format import (
    WORD_PIECES,
    Allowed,
    Piece,
    SkeletonFormat,
    classify_piece,
    piece_need,
)

logger = logging.getLogger(__name__)

_MASK_CACHE = 256  # masks of one vocabulary; each is one bool per token
_STATE_CACHE = 4096  # format states by token history; verify asks for every tree node
_LOOKBACK = 16  # tokens searched back for a cached state before reading from the start
_NOT_ALLOWED = -1


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer's tokens, classified once: the text each reads as, its `Piece` class.

    Masks are built in numpy: its single-threaded vector ops over the vocabulary stay cheap
    on a busy CPU, where torch parallelises ops above 32k elements and its threads then
    contend for the few cores.
    """

    pieces: tuple[str, ...]  # token id -> its text as it reads after other text
    classes: np.ndarray  # shape: (vocab,) int8, a Piece value or _NOT_ALLOWED
    needs: np.ndarray  # shape: (vocab,) int32, piece_need of word pieces, else 0
    numbers: dict[str, tuple[int, ...]]  # digits-only text -> its token ids
    end_ids: tuple[int, ...]  # the tokens SGLang stops on: EOS / end of turn

    @classmethod
    def from_pieces(cls, pieces: Sequence[str], end_ids: Sequence[int]) -> Vocabulary:
        kinds = [classify_piece(p) for p in pieces]
        classes = np.array([_NOT_ALLOWED if k is None else int(k) for k in kinds], dtype=np.int8)
        needs = [piece_need(p) if k in WORD_PIECES else 0 for p, k in zip(pieces, kinds)]
        numbers: dict[str, tuple[int, ...]] = {}
        for token, (text, kind) in enumerate(zip(pieces, kinds)):
            if kind is Piece.NUMBER:
                numbers[text] = (*numbers.get(text, ()), token)
        return cls(tuple(pieces), classes, np.array(needs, dtype=np.int32), numbers, tuple(end_ids))

    def text(self, token_ids: Sequence[int]) -> str:
        # An id outside the tokenizer (padded vocabularies) reads as a character no format
        # allows, so the text goes dead rather than silently skipping it.
        n = len(self.pieces)
        return "".join(self.pieces[t] if 0 <= t < n else "\ufffd" for t in token_ids)

    def allowed_mask(self, allowed: Allowed, size: int) -> np.ndarray:
        """shape: (size,) bool, True where a token may come next; the end when nothing fits."""
        mask = np.zeros(size, dtype=bool)
        n = min(size, len(self.pieces))
        classes, needs = self.classes[:n], self.needs[:n]
        # A tokenizer may hold more tokens than the model's logits: only ids below `size`.
        ends = [t for t in self.end_ids if t < size]
        for piece in allowed.pieces:
            if piece is Piece.END:
                mask[ends] = True
            elif piece is Piece.NUMBER and allowed.number_rest:
                rest = allowed.number_rest
                prefixes = (ts for text, ts in self.numbers.items() if rest.startswith(text))
                mask[[t for ts in prefixes for t in ts if t < size]] = True
            elif piece in WORD_PIECES:
                mask[:n] |= (classes == int(piece)) & (needs <= allowed.max_chars)
            else:
                mask[:n] |= classes == int(piece)
        if not mask.any():  # nothing fits (see SkeletonFormat.allowed): end the skeleton here
            mask[ends] = True
        return mask


def load_vocabulary(tokenizer_path: str) -> Vocabulary:
    """Read each token's text as it follows other text, so SentencePiece's leading-space
    marker and byte-level BPE's both come out as the " " they print."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    anchor = tokenizer.encode("a", add_special_tokens=False)
    head = tokenizer.decode(anchor)
    texts = tokenizer.batch_decode(
        [anchor + [t] for t in range(len(tokenizer))],
        skip_special_tokens=False, clean_up_tokenization_spaces=False,
    )  # fmt: skip
    pieces = [t[len(head) :] if t.startswith(head) else "\ufffd" for t in texts]
    return Vocabulary.from_pieces(pieces, _end_ids(tokenizer, tokenizer_path))


def _end_ids(tokenizer, tokenizer_path: str) -> list[int]:
    """The tokenizer's EOS and the generation config's: what SGLang stops a request on."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(tokenizer_path).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        eos = None
    ids.update([eos] if isinstance(eos, int) else eos or [])
    if not ids:
        raise ValueError(
            f"the tokenizer at {tokenizer_path!r} has no EOS token, so a skeleton could never "
            "end cleanly; use a chat model's tokenizer"
        )
    return sorted(ids)


@dataclass
class Constraint:
    """One (vocabulary, format) pair with its caches: the masks and the states by history."""

    vocab: Vocabulary
    start: SkeletonFormat
    _masks: OrderedDict[tuple[Allowed, int], np.ndarray] = field(default_factory=OrderedDict)
    _states: OrderedDict[tuple[int, ...], SkeletonFormat] = field(default_factory=OrderedDict)

    def state(self, output_ids: Sequence[int]) -> SkeletonFormat:
        """The format after `output_ids`, read on from the longest recently seen prefix
        (shared with the cache: copy it before feeding it more)."""
        key = tuple(output_ids)
        cached = self._states.get(key)
        if cached is not None:
            self._states.move_to_end(key)
            return cached
        base, done = self.start, 0
        for k in range(len(key) - 1, max(len(key) - _LOOKBACK, 0) - 1, -1):
            prefix = self._states.get(key[:k])
            if prefix is not None:
                base, done = prefix, k
                break
        state = base.copy()
        state.feed(self.vocab.text(key[done:]))
        _remember(self._states, key, state, _STATE_CACHE)
        return state

    def blocked(self, output_ids: Sequence[int], size: int) -> np.ndarray:
        """shape: (size,) bool, True for every token that may not follow `output_ids`."""
        allowed = self.state(output_ids).allowed()
        key = (allowed, size)
        blocked = self._masks.get(key)
        if blocked is None:
            blocked = ~self.vocab.allowed_mask(allowed, size)
            _remember(self._masks, key, blocked, _MASK_CACHE)
        return blocked


def _remember(cache: OrderedDict, key, value, limit: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)


@functools.lru_cache(maxsize=8)
def _vocabulary(tokenizer_path: str) -> Vocabulary:
    return load_vocabulary(tokenizer_path)


@functools.lru_cache(maxsize=32)
def constraint_for(tokenizer_path: str, config: SoTConfig, prefill: str) -> Constraint:
    return Constraint(_vocabulary(tokenizer_path), SkeletonFormat(config, prefill))


class SkeletonConstraint(sgl.CustomLogitProcessor):
    """Masks each row's logits to the tokens the skeleton format allows after its output.

    Configured subclasses come from `skeleton_processor_for`; the base class has no tokenizer.
    """

    TOKENIZER_PATH: str = ""
    CONFIG: SoTConfig = DEFAULT_CONFIG
    PREFILL: str = SKELETON_PREFILL
    _warned: set[str] = set()  # problems already logged, once per process
    _unloadable: set[str] = set()  # tokenizer paths that failed: not retried every step

    def __call__(
        self, logits: torch.Tensor, custom_param_list: list[dict[str, Any] | None] | None = None
    ) -> torch.Tensor:
        constraint = self._constraint()
        if constraint is None or not custom_param_list or not self._history_is_current():
            return logits
        blocked = np.zeros(tuple(logits.shape), dtype=bool)
        for row, params in enumerate(custom_param_list):
            req = params.get("__req__") if isinstance(params, dict) else None
            if req is None:
                self._warn_once("a request without custom_params gets no __req__ from SGLang, so "
                                "its skeleton is unconstrained; send custom_params={} at least")  # fmt: skip
                continue
            blocked[row] = constraint.blocked(req.output_ids, logits.shape[-1])
        # One masked fill for the whole call: per-row torch ops cost more than the masks.
        return logits.masked_fill_(torch.from_numpy(blocked).to(logits.device), float("-inf"))

    def _constraint(self) -> Constraint | None:
        if self.TOKENIZER_PATH in self._unloadable:
            return None
        try:
            return constraint_for(self.TOKENIZER_PATH, self.CONFIG, self.PREFILL)
        except (OSError, ValueError) as exc:  # a scheduler must not die of a bad request
            self._unloadable.add(self.TOKENIZER_PATH)
            self._warn_once(f"skeleton constraint disabled: cannot load {self.TOKENIZER_PATH!r}: {exc}")
            return None

    @classmethod
    def _history_is_current(cls) -> bool:
        stale = stale_history_reason()
        if stale is not None:
            cls._warn_once(f"skeleton constraint not applied: {stale}")
        return stale is None

    @classmethod
    def _warn_once(cls, message: str) -> None:
        if message not in cls._warned:
            cls._warned.add(message)
            logger.warning(message)


def skeleton_processor_for(
    tokenizer_path: str, config: SoTConfig = DEFAULT_CONFIG, prefill: str = SKELETON_PREFILL
) -> str:
    """The serialized processor for `/generate`'s `custom_logit_processor` field; the
    tokenizer path is read where the processor runs (the server)."""
    if not isinstance(config, SoTConfig):
        raise ValueError(f"config must be a SoTConfig, got {type(config).__name__}")
    if not isinstance(tokenizer_path, str) or not tokenizer_path:
        raise ValueError(f"tokenizer_path must be a non-empty path or hub id, got {tokenizer_path!r}")
    SkeletonFormat(config, prefill)  # refuses a pre-fill the format cannot start from
    configured = type(
        "ConfiguredSkeletonConstraint",
        (SkeletonConstraint,),
        {"TOKENIZER_PATH": tokenizer_path, "CONFIG": config, "PREFILL": prefill, "__module__": __name__},
    )
    return configured.to_str()


def constraint_runs(
    *,
    enable_custom_logit_processor: bool,
    speculative_algorithm: str | None,
    disable_overlap_schedule: bool,
    delay_sample: bool = False,
) -> bool:
    """Whether a server with these settings runs the constraint on each request's current output."""
    return enable_custom_logit_processor and stale_history(
        speculative_algorithm, disable_overlap_schedule, delay_sample
    ) is None


def stale_history(
    speculative_algorithm: str | None, disable_overlap_schedule: bool, delay_sample: bool
) -> str | None:
    """Why a server with these settings hands processors a stale history; None if it does not.

    SPECSOT hands processors every verify tree node's own history (verify_processors.py).
    Without speculation the history is current only when overlap scheduling is off or
    sampling is delayed (SGLANG_ENABLE_DELAY_SAMPLE); SGLang's plain overlap scheduler samples
    one token behind (tp_worker.py:718-745). SGLang's own speculative algorithms apply a
    processor to every draft position with the pre-draft history, which would let a tree
    accept what the format forbids, so they never get it.
    """
    if speculative_algorithm:
        if str(speculative_algorithm).upper() == "SPECSOT":
            return None
        return (f"--speculative-algorithm {speculative_algorithm} applies processors to draft "
                "tokens with the history before the draft, so a tree could accept what the "
                "format forbids; use --speculative-algorithm SPECSOT, or no speculation")  # fmt: skip
    if disable_overlap_schedule or delay_sample:
        return None
    return ("SGLang's overlap scheduler hands processors each request's output one token "
            "late, and a mask from that history garbles the skeleton; launch with "
            "--disable-overlap-schedule, or set SGLANG_ENABLE_DELAY_SAMPLE=1, or use "
            "--speculative-algorithm SPECSOT")  # fmt: skip


@functools.cache
def stale_history_reason() -> str | None:
    """`stale_history` of the server running in this process, or None when no server runs
    here (as in a test: the caller is trusted).

    Read once per process from the settings in effect (after SGLang resolved them), which do
    not change while a server runs.
    """
    try:
        algorithm = sgl.get_spec().speculative_algorithm
        no_overlap = bool(sgl.get_schedule().disable_overlap_schedule)
    except ValueError:  # "Global server args is not set yet!": not inside a server
        return None
    return stale_history(algorithm, no_overlap, sgl.delay_sample_enabled())


def with_server_constraint(options: SoTOptions, server_args) -> SoTOptions:
    """`options` with the skeleton constraint added when this server can run it and the
    client sent no processor of its own: server-side SoT's default, so a plain OpenAI client
    gets planned skeletons without sending anything."""
    if options.skeleton_logit_processor is not None:
        return options
    runs = constraint_runs(
        enable_custom_logit_processor=bool(getattr(server_args, "enable_custom_logit_processor", False)),
        speculative_algorithm=getattr(server_args, "speculative_algorithm", None),
        disable_overlap_schedule=bool(getattr(server_args, "disable_overlap_schedule", False)),
        delay_sample=sgl.delay_sample_enabled(),
    )
    if not runs:
        return options
    path = server_args.tokenizer_path or server_args.model_path
    return dataclasses.replace(options, skeleton_logit_processor=_cached_processor(path, options.config))


@functools.lru_cache(maxsize=32)
def _cached_processor(tokenizer_path: str, config: SoTConfig) -> str:
    # Serializing makes a class and pickles it: once per (tokenizer, config), not per request.
    return skeleton_processor_for(tokenizer_path, config)
