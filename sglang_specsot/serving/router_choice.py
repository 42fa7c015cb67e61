"""Which router server-side SoT uses in mode "auto": the question classifier (default) or the
rules alone, from the environment variable SGLANG_SPECSOT_ROUTER ("classifier" | "rules").

The classifier (models/router_classifier.py) needs all-MiniLM-L6-v2 in the HTTP server's
process: it is loaded once, in a background thread from start-up, so the first request does
not wait for it. If it cannot be loaded (no network for the first fetch, a damaged cache), the
server logs why once and routes by the rules alone; each answer's route says which decided
(`metadata.specsot.route.rule`: "classifier" or a rule's name).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from sglang_specsot.sot.quality_gate import QUESTION, configured_quality_gate, with_configured_gate
from sglang_specsot.sot.router import ROUTERS, QuestionClassifier
from sglang_specsot.sot.runner import SoTOptions

logger = logging.getLogger(__name__)

ROUTER_ENV = "SGLANG_SPECSOT_ROUTER"
_lock = threading.Lock()
_loaded: dict[str, QuestionClassifier | None] = {}  # "classifier" -> it, or None after a failure


def server_router() -> str:
    """The router named by SGLANG_SPECSOT_ROUTER (default "classifier")."""
    router = os.environ.get(ROUTER_ENV, "classifier").strip().lower()
    if router not in ROUTERS:
        raise ValueError(f"{ROUTER_ENV}={router!r} is not one of {', '.join(map(repr, ROUTERS))}")
    return router


def server_classifier() -> QuestionClassifier | None:
    """The process's question classifier, loaded on first call; None when it cannot load."""
    with _lock:
        if "classifier" not in _loaded:
            _loaded["classifier"] = _load()
        return _loaded["classifier"]


def _load() -> QuestionClassifier | None:
    from sglang_specsot.models.fetcher import FetchError
    from sglang_specsot.models.router_classifier import load_default_classifier

    try:
        return load_default_classifier()
    except (FetchError, OSError, ValueError, RuntimeError) as exc:
        logger.warning("sglang-specsot: the SoT question classifier could not be loaded (%s); "
                       "routing by the rules alone (set %s=rules to silence this)", exc, ROUTER_ENV)  # fmt: skip
        return None


def warm_up() -> None:
    """Start loading the classifier in the background, if this server routes with it; say which
    quality head (sot/quality_gate.py) mode "auto" uses, and warn where it can never run."""
    gate = configured_quality_gate()
    if gate is not None:
        logger.info("sglang-specsot: mode auto's quality head reads the %s (%s)", gate.representation,
                    gate.head.provenance.get("command", "a head file"))  # fmt: skip
        if gate.representation == QUESTION and server_router() != "classifier":
            logger.warning("sglang-specsot: the quality head reads the question classifier's embedding, and "
                           "%s=rules computes none: it will veto nothing", ROUTER_ENV)  # fmt: skip
    if server_router() == "classifier":
        threading.Thread(target=server_classifier, name="specsot-router-warm-up", daemon=True).start()


def with_server_classifier(options: SoTOptions) -> SoTOptions:
    """`options` with the server's classifier and quality gate (sot/quality_gate.py), for mode
    "auto" when none is set. Blocks while the classifier loads: call it off the event loop."""
    options = with_configured_gate(options)
    if options.mode != "auto" or options.classifier is not None or server_router() != "classifier":
        return options
    classifier = server_classifier()
    return options if classifier is None else dataclasses.replace(options, classifier=classifier)
