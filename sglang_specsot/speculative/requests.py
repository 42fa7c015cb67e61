"""The requests a SPECSOT worker serves: their SoT tags, and when each is done with.

A request's tag (sot/tag.py, from its `custom_params`) says its SoT role and group; the
drafters key their histories by rid and the policy its estimates by group. A request leaves
the worker when it leaves the decode batch, or, if it ended at prefill (a prefix commit's
`max_new_tokens=0`, EOS first), once SGLang marks it finished.
"""

from __future__ import annotations

import logging

from sglang_specsot.sot.tag import PLAIN_TAG, SoTTag
from sglang_specsot.speculative.policy.values import StepView

logger = logging.getLogger(__name__)
_MAX_WARNED = 32  # distinct malformed-tag warnings logged; later ones are not
_LAST_WARNING = f" (the last of {_MAX_WARNED} such warnings; further malformed tags are ignored silently)"


class RequestBook:
    """Tags by rid, and which requests are decoding or still awaiting their first decode."""

    def __init__(self) -> None:
        self.tags: dict[str, SoTTag] = {}
        self._decoding: set[str] = set()
        # Prefilled but not yet seen decoding: forgotten once SGLang marks them finished.
        self._awaiting_decode: dict[str, object] = {}
        self._warned: set[str] = set()

    def read_tag(self, req) -> SoTTag:
        """`req`'s SoT tag, kept for its life; a malformed one is logged (boundedly) and plain."""
        tag, problem = SoTTag.parse(getattr(req.sampling_params, "custom_params", None))
        if problem is not None and problem not in self._warned and len(self._warned) < _MAX_WARNED:
            # The problem quotes the client's values: bounded, or any client could grow this set.
            self._warned.add(problem)
            logger.warning("SPECSOT: ignoring malformed SoT metadata (%s); drafting from the request alone%s",
                           problem, _LAST_WARNING if len(self._warned) == _MAX_WARNED else "")  # fmt: skip
        self.tags[req.rid] = tag
        return tag

    def role(self, rid: str) -> str:
        return self.tags.get(rid, PLAIN_TAG).role

    def key(self, rid: str) -> str:
        """The acceptance key: branches of one SoT answer write alike and share one estimate."""
        tag = self.tags.get(rid)
        return tag.group if tag is not None and tag.group is not None else rid

    def tag_tuple(self, reqs) -> tuple[SoTTag, ...]:
        return tuple(self.tags.get(r.rid, PLAIN_TAG) for r in reqs)

    def view(self, reqs) -> StepView:
        """The batch as the policy sees it."""
        return StepView(
            keys=tuple(self.key(r.rid) for r in reqs),
            roles=tuple(self.role(r.rid) for r in reqs),
            left=tuple(_tokens_left(r) for r in reqs),
        )

    def prefilled(self, req) -> None:
        self._awaiting_decode[req.rid] = req

    def finished_at_prefill(self) -> list[str]:
        """Requests that ended at prefill and never decoded: the scheduler marks them finished
        an iteration after their forward (under overlap), so each step looks again."""
        done = [rid for rid, req in self._awaiting_decode.items() if req.finished()]
        for rid in done:
            del self._awaiting_decode[rid]
        return done

    def decoded(self, rids: tuple[str, ...]) -> list[str]:
        """This step's decode batch; returns the requests that left it (finished or retracted)."""
        current = set(rids)
        for rid in current:
            self._awaiting_decode.pop(rid, None)
        left = sorted(self._decoding - current)
        self._decoding = current
        return left

    def forget(self, rid: str) -> None:
        self.tags.pop(rid, None)

    def clear(self) -> None:
        self.tags.clear()
        self._decoding.clear()
        self._awaiting_decode.clear()


def _tokens_left(req) -> int | None:
    cap = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)
    return None if cap is None else max(1, cap - len(req.output_ids))
