"""Subclasses of SGLang's classes that give its private methods and fields public names.

Where SGLang's contract is a private method, the subclass overrides it to call a public one
(or exposes it under one), so the rest of the package never names it. Built on first use
(importing SGLang's classes costs seconds); adapter.py resolves each by name from `CLASSES`.
"""

from __future__ import annotations


def _tagging_runtime_endpoint() -> type:
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    class TaggingRuntimeEndpoint(RuntimeEndpoint):
        """A RuntimeEndpoint whose subclasses may add fields to every /generate body."""

        def _add_images(self, s, data):
            # RuntimeEndpoint builds every /generate body inline and passes the finished body
            # through this one method just before posting it (runtime_endpoint.py:109-335).
            super()._add_images(s, data)
            self.extend_generate_body(s, data)

        def extend_generate_body(self, state, body: dict) -> None:
            """Add to the /generate `body` of the program `state` about to post it."""

        def get_server_info(self) -> dict:
            """SGLang's /server_info, or behind SGLang's gateway, which forwards only the older
            /get_server_info route (smg 1.13 answers /server_info with a 404), that route's
            answer: the same (http_server.py:853-866)."""
            from sglang.utils import http_request

            res = http_request(self.base_url + "/server_info", api_key=self.api_key, verify=self.verify)
            if res.status_code == 404:
                res = http_request(self.base_url + "/get_server_info", api_key=self.api_key, verify=self.verify)
            self._assert_success(res)
            return res.json()

    return TaggingRuntimeEndpoint


def _public_draft_stages(base: type, name: str) -> type:
    """SGLang's draft worker `base` with its draft-extend stages under public names."""

    class PublicDraftStages(base):
        def _rebuild_topk1_chain_buffers(self) -> None:
            self.rebuild_chain_buffers(super()._rebuild_topk1_chain_buffers)

        def rebuild_chain_buffers(self, rebuild) -> None:
            """Build SGLang's top-k 1 chain buffers by calling `rebuild()`; subclasses may wrap it
            (SGLang calls it from __init__ and whenever the step count changes)."""
            rebuild()

        def refresh_chain_buffers(self) -> None:
            """Rebuild SGLang's top-k 1 chain buffers for the current step count (draft_forward
            reads them; SGLang's own adaptive worker rebuilds them when it changes steps)."""
            self._rebuild_topk1_chain_buffers()

        def draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids):
            """Draft-extend over the prompt; SGLang's draft input (top-k for step one)."""
            return self._draft_extend_for_prefill(batch, target_hidden_states, next_token_ids)

        def draft_extend_for_decode(self, batch, result) -> None:
            """Draft-extend over the verify window; fills `result.next_draft_input`."""
            self._draft_extend_for_decode(batch, result)

    PublicDraftStages.__name__ = PublicDraftStages.__qualname__ = name
    return PublicDraftStages


def _draft_model_worker() -> type:
    """SGLang's standalone draft worker (a whole draft LM), stages public."""
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker

    return _public_draft_stages(StandaloneDraftWorker, "DraftModelWorker")


def _eagle_head_worker() -> type:
    """SGLang's EAGLE V2 draft worker (an EAGLE or EAGLE-3 head over the target's hidden
    states and embedding), stages public."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    return _public_draft_stages(EagleDraftWorker, "EagleHeadWorker")


def _spec_worker_base() -> type:
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

    class SpecWorkerBase(BaseSpecWorker):
        """SGLang's BaseSpecWorker, whose `target_worker` / `draft_worker` properties read two
        private fields (base_spec_worker.py:202-210), with a public way to set them."""

        def bind_workers(self, target_worker, draft_worker=None) -> None:
            """The workers the scheduler reaches through `target_worker` / `draft_worker`."""
            self._target_worker = target_worker
            self._draft_worker = draft_worker

    return SpecWorkerBase


def _future_map_base() -> type:
    from sglang.srt.managers.overlap_utils import FutureMap

    class FutureMapBase(FutureMap):
        """SGLang's FutureMap with its gather of the relayed spec extras under a public name."""

        def _resolve_spec_extras(self, batch) -> None:
            self.resolve_spec_extras(batch)

        def resolve_spec_extras(self, batch) -> None:
            """Fill `batch.spec_info` with the relayed top-k, bonus tokens and hidden states
            (SGLang's own gather, overlap_utils.py:476-534, unless a subclass overrides it)."""
            FutureMap._resolve_spec_extras(self, batch)

    return FutureMapBase


CLASSES = {
    "TaggingRuntimeEndpoint": _tagging_runtime_endpoint,
    "DraftModelWorker": _draft_model_worker,
    "EagleHeadWorker": _eagle_head_worker,
    "FutureMapBase": _future_map_base,
    "SpecWorkerBase": _spec_worker_base,
}
