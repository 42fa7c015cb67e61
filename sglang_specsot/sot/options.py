"""What a caller asks of one SoT answer (`SoTOptions`), validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.quality_gate import QualityGate
from sglang_specsot.sot.router import QuestionClassifier
from sglang_specsot.sot.tag import MODES


@dataclass(frozen=True, slots=True)
class SoTOptions:
    """What a caller asks of one SoT answer; validated at construction."""

    mode: str = "auto"  # "auto": the router decides; "on": always try SoT; "off": never
    config: SoTConfig = DEFAULT_CONFIG
    # The caller's cap on the answer's total completion tokens (skeleton + branches, or the
    # normal answer): what an OpenAI client's max_tokens means (sot.budget splits it).
    max_new_tokens: int | None = None
    # A serialized sglang CustomLogitProcessor for the skeleton (the server needs
    # --enable-custom-logit-processor); None: unconstrained.
    skeleton_logit_processor: str | None = None
    # The question classifier that routes in mode "auto" once the hard rules have passed
    # (models/router_classifier.py); None: the rules alone. Server-side SoT and the frontend
    # program plug in the shipped one by default.
    classifier: QuestionClassifier | None = None
    # The quality router (sot/quality_gate.py) that, in mode "auto", answers normally where it
    # finds SoT's answer would read worse; None: no quality check. Server-side SoT and the
    # frontend program plug in the shipped head where one ships.
    quality_gate: QualityGate | None = None
    # The client's system prompt (persona, language, tone), or None: the skeleton is planned
    # for it, every branch is written under it, a normal answer gets it as its system turn,
    # and in mode "auto" the hard rules read it too (a system prompt that asks for code,
    # JSON or brevity keeps the answer normal, whatever the question).
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not one of {MODES}")
        if not isinstance(self.config, SoTConfig):
            raise ValueError(f"config must be a SoTConfig, got {type(self.config).__name__}")
        cap = self.max_new_tokens
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"max_new_tokens={cap!r} must be a positive integer or None")
        processor = self.skeleton_logit_processor
        if processor is not None and not (isinstance(processor, str) and processor):
            raise ValueError(
                "skeleton_logit_processor must be a serialized CustomLogitProcessor string "
                f"(CustomLogitProcessor.to_str()) or None, got {processor!r}"
            )
        if self.classifier is not None and not callable(self.classifier):
            raise ValueError(
                f"classifier must be a callable question -> Suitability or None, got {self.classifier!r}"
            )
        if self.quality_gate is not None and not isinstance(self.quality_gate, QualityGate):
            raise ValueError(f"quality_gate must be a sot.quality_gate.QualityGate or None, got {self.quality_gate!r}")
        system = self.system_prompt
        if system is not None and not (isinstance(system, str) and system.strip()):
            raise ValueError(f"system_prompt must be non-empty text or None, got {system!r}")
