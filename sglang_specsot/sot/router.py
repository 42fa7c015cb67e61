"""Decide per question whether SoT pays off: rules, a question classifier, a model's verdict.

SoT helps only answers made of independent points that are long enough to amortise the
skeleton; it hurts code, math, single facts, writing, role-play and structured output.
Rules run in a fixed order, first match wins; the order encodes which signal is stronger.
The hard rules (code, math, translation, ...) always decide first. After them, a question
classifier's verdict (`Suitability`, from sentence embeddings: models/router_classifier.py)
decides when the caller has one; the soft rules decide otherwise. Measure on any labelled set:
    python -m sglang_specsot.sot.router eval FILE.jsonl|NAME [--router classifier|rules]
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sglang_specsot.sot.agreement import RouterAgreement, load_labelled, measure_agreement
from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.prompts import ROUTE_DIRECT, ROUTE_LIST
from sglang_specsot.sot.router_head import Suitability
from sglang_specsot.sot.text import collapse_spaces

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The routing phase's result: SoT or a normal answer, which rule decided, and why."""

    use_sot: bool
    rule: str  # short name of the deciding rule, e.g. "code", "list_ask", "classifier"
    reason: str
    source: str = "rules"  # "rules" | "classifier" | "model" | "quality_head"


# question -> the classifier's verdict; what the caller plugs into SoTOptions.classifier.
QuestionClassifier = Callable[[str], Suitability]


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


_BREVITY = _rx(
    r"\b(briefly|concisely|be (?:brief|concise|succinct|terse)|keep it short|short answer|tl;?dr|"
    r"one[- ]word|yes or no|"
    r"in (?:one|a single|1|two|2|three|five) (?:sentence|word|line)s?|in a (?:few|couple of) words|"
    r"(?:output|give|return) (?:the|your) answer only|answer only|just tell me|"
    r"(?:under|at most|no more than|fewer than|less than|within|maximum of) \d+ "
    r"(?:words|sentences|lines|characters|tokens))\b"
)
_STRUCTURED = _rx(
    r"\b(json|yaml|xml|csv|schema|tool[ _-]?calls?|function[ _-]?calls?|"
    r"call the (?:\w+ )?(?:tool|function|api)|output format|respond only with|return only)\b"
)
_CODE = (
    _rx(r"```|#include|\bdef \w+\(|console\.log"),
    _rx(r"(?:^|[.?!]\s+)implement\b"),  # "Implement X" as a request is nearly always code
    _rx(
        r"\b(implement|develop|write|code|debug|refactor|fix|optimi[sz]e)\b[^.?!]{0,80}?"
        r"\b(program|function|method|class|code|algorithm|regex|regular expression|"
        r"data structure|query|snippet|unit tests?)\b"
    ),
    _rx(r"\b(in|using) (python|c\+\+|c#|java|javascript|typescript|rust|golang|ruby|php|bash)\b"),
)
_MATH = (
    _rx(
        r"\b(solve|calculate|compute|simplify|differentiate|derivative|integral|equation|"
        r"find the value|prove that)\b"
    ),
    _rx(r"\w\s*=\s*[-\w(]|\d\s*\^\s*\d|[a-z]\^\d|\b[a-z]\(\s*[a-z0-9]\s*\)"),
    _rx(r"\(\s*-?\d+(?:\.\d+)?\s*,\s*-?\d+(?:\.\d+)?\s*\)"),  # a coordinate pair
)
_TRANSLATE = _rx(
    r"\btranslat(e|es|ed|ion|ing)\b|\bhow (do|would|can) (you|i|we) say\b|"
    r"\b(put|render|turn|convert) (this|that|the following)[^.?!]{0,40}\binto\b|"
    r"\bwhat does '[^']+' mean\b|\bthe \w+ word for\b"
)
_EXTRACT = _rx(
    r"\b(extract|pull out|tag each|classify (this|the following)|sort these|correct the grammar)\b|"
    r"\b(mentioned|in (this|the following) (text|sentence|passage|message|review|paragraph))\b|"
    r"\bfrom (this|the following) (text|sentence|passage|message|review|paragraph)\b"
)
# Domain signals. A list-shaped ask about code, arithmetic or a language is still a how-to or
# a lookup with one right answer ("What are the prime factors of 360?", "How do I center a
# div in CSS?", "What are the French names of the days?"), so these veto a list ask.
_LANGS = (
    r"(?:french|spanish|german|italian|japanese|chinese|mandarin|korean|arabic|russian|"
    r"portuguese|hindi|latin|greek|dutch|swedish|polish|turkish|english)"
)
_LANGUAGE_LOOKUP = _rx(
    rf"\b(say|count|spell|pronounce|greet)\b[^.?!]{{0,40}}\b(in|into) {_LANGS}\b|"
    rf"\b{_LANGS} (names?|words?|phrases?|for|translations?|equivalents?)\b"
)
_CODE_TOPIC = _rx(
    r"\b(python|javascript|typescript|java|c\+\+|c#|css|html|sql|git|bash|rust|golang|php|"
    r"regex|pandas|numpy|div|array|dataframe|pointer|compiler|stack ?overflow)\b|\bin c\b"
)
_MATH_TOPIC = _rx(
    r"\b(prime|primes|factors of \d|roots? of|fibonacci|slope|median|irrational|integers?|"
    r"fractions?|decimals?|percent|percentage|factorial|probability|digits)\b|\d\s*[-+*/x]\s*\d"
)
# Nouns that make a question about code or math a survey of independent points after all.
_SURVEY_NOUN = _rx(
    r"\b(differences|similarities|practices|pros and cons|advantages|disadvantages|benefits|"
    r"drawbacks|mistakes|pitfalls|trade-?offs|principles|history|uses|applications)\b"
)
# "What are the noble gases?": a short what-are question with no list noun is a closed set
# with one right answer, not points to expand.
_CLOSED_SET = _rx(
    r"^(what|which) (are|were) (the )?(\w+ ){0,3}\w+( of (the )?(\w+ ){0,3}\w+)?\W*$"
)
_ESTIMATE = _rx(r"\bhow many\b|\bstep[- ]by[- ]step\b")
# A changed premise ("What if ...", "How would the world be different if ...", "Imagine a
# planet ..."): list-shaped, but each branch invents its consequences alone, and the 1.5B's
# branches contradicted the world and each other ("no need for water, food or buildings" on an
# always-sunlit planet; humans breathing underwater shifting ocean currents): both such tuning
# questions lost to the normal answer with blind readers (quality_veto).
_COUNTERFACTUAL = (
    _rx(r"\bwhat if\b|\bsuppose\b|(?:^|[.?!]\s+)imagine\b"),
    _rx(r"\bwhat (would|might|will) (happen|be different|change)\b"),
    _rx(r"\bwhat (would|might) [^?]{1,60}\b(look|be) like\b"),
    _rx(r"\bhow (would|might) [^?]{1,80}\b(be different|change|differ|develop|be organi[sz]ed)\b"),
)
_WRITING = (
    _rx(
        r"(?:^|[.?!]\s+)(?:please\s+)?(write|compose|draft|pen)\b"
        r"(?!\s+(?:a|an|some|me)?\s*(?:list|outline)\b)"
    ),
    _rx(r"\bhelp me (write|compose|draft|craft|prepare)\b"),
    _rx(
        r"\b(write|compose|draft|craft|structure|create|prepare)\b[^.?!]{0,60}?"
        r"\b(e-?mail|letter|essay|poem|story|blog|post|review|script|speech|announcement|"
        r"article|tweet|lyrics|song|haiku|limerick|sonnet|slogan|toast|eulogy|memo|"
        r"press release|advertisement|dialogue)\b"
    ),
)
_LIST_ASK = (
    _rx(r"\bhow (can|could|might|should)\b"),
    _rx(r"\bhow (do|does) (i|we|you|one|someone|people)\b"),
    _rx(r"\bhow (do|does|did|can|will|would) [^?]{1,80}?\b(affect|influence|impact|shape|change)"),
    _rx(r"\bwhat (are|were) (some|the)\b|^what (are|were)\b"),
    _rx(r"\bwhat if\b"),
    _rx(
        r"\bwhy (might|would|do|does|did|could|should) (someone|some|people|many|most|"
        r"a person|one|they|we|you|companies|businesses|students|customers)\b"
    ),
    _rx(r"(?:^|[.?!]\s+)(list|suggest|recommend|outline|enumerate|compare|contrast)\b"),
    _rx(r"\bname (some|a few|several|\d+|two|three|four|five|the (main|key|major))\b"),
    # counterfactuals: the consequences of a changed premise are independent points
    _rx(r"\bwhat (would|might|will) (happen|be different|change)\b"),
    _rx(r"\bwhat (would|might) [^?]{1,60}\b(look|be) like\b"),
    _rx(r"\bhow (would|might) [^?]{1,80}\b(be different|change|differ|develop|be organi[sz]ed)\b"),
    _rx(r"\bhow (has|have|did) [^?]{1,60}\b(changed|shaped|transformed|affected)\b"),
    _rx(r"\bwhat (impact|effects?|influence|advice|role)\b|\bfor and against\b"),
    _rx(r"\bwhat (distinguishes|separates)\b|\bhow (do|does) [^?]{1,60}\bdiffer\b"),
    _rx(r"\bwhat can (i|we|you|one|they|parents|students|teams) do\b|\b(best|good) ways? to\b"),
    _rx(r"\bwhere (do|should) (i|we) (start|begin)\b|\bany (ideas|tips|suggestions|advice)\b"),
    _rx(r"\b(give|share|suggest) (me )?(some|a few|several|\d+)\b"),
)
# "what <plural noun> would/are ...": asks for several things; checked in code below.
_WHAT_PLURAL = _rx(
    r"\bwhat ((?:\w+ ){0,2}\w+s) (would|could|should|do|are|can|might|will|did|have|make|help|suggest|show|"
    r"indicate|matter|affect|exist)\b"
)
_NOT_PLURAL = {"this", "is", "was", "does", "has", "his", "its", "us", "as", "yours", "ours"}
_ROLEPLAY = _rx(
    r"(?:^|[.?!,]\s+)(as an? |pretend (?:to be|you are|you're)|imagine (?:you are|you're|"
    r"yourself as|being)|you are an? |if you were an? |act as|role-?play|play the role)"
    r"|\byourself as an?\b"
)
_YES_NO = _rx(
    r"(?:^|,\s*)(is|are|was|were|do|does|did|should|would|will|has|have|can|could|may|must) "
    r"(it|we|i|you|they|there|he|she|this|that|these|those|people|a|an|the|our|my|your)\b"
)
_REQUEST = _rx(
    r"^(?:please )?(can|could|would|will) you (?:please )?(explain|describe|list|tell|give|"
    r"suggest|share|outline|recommend|name|provide|compare|summari[sz]e|elaborate|discuss)\b"
)
_SINGLE_FACT = (
    _rx(r"^(who|when|where|which|whose)\b"),
    _rx(r"^(what|who) (is|was|are|were|does) [^?.!]{1,40}[?.!]?$"),  # short "what is X?"
)
_LIST_NOUN = _rx(
    r"\b(components|arguments|functions|threats|uses|topics|areas|achievements|contributions|"
    r"ways|tips|strategies|steps|factors|differences|similarities|challenges|benefits|"
    r"advantages|disadvantages|pros and cons|implications|consequences|effects|impacts|"
    r"reasons|examples|methods|techniques|clues|signs|basics|fundamentals|ideas|types|kinds|"
    r"aspects|features|applications|considerations|recommendations|suggestions|practices|"
    r"habits|options|alternatives|(?<!what )causes|risks|principles|elements|characteristics|trends|"
    r"lessons|mistakes|pitfalls|approaches|solutions|obstacles|opportunities|drawbacks)\b"
)
_MECHANISM = _rx(
    r"\bhow (does|do|did) [^?]{1,60}?\bwork|\bexplain (the process|how|why)\b|"
    r"\bwhat causes\b|^why (is|are|does|do)\b"
)


def _asks_for_plural(text: str) -> bool:
    for match in _WHAT_PLURAL.finditer(text):
        last = match.group(1).split()[-1].lower()
        if last not in _NOT_PLURAL and not last.endswith("ss"):
            return True
    return False


def _list_ask(text: str) -> bool:
    return any(p.search(text) for p in _LIST_ASK) or _asks_for_plural(text)


def _yes_no(text: str) -> bool:
    return bool(_YES_NO.search(text)) and not _REQUEST.search(text)


def _single_fact(text: str) -> bool:
    # "Which factors ..." asks for several things, not one fact.
    return any(p.search(text) for p in _SINGLE_FACT) and not _LIST_NOUN.search(text[:40])


def _domain(text: str) -> bool:
    on_topic = _CODE_TOPIC.search(text) or _MATH_TOPIC.search(text) or _LANGUAGE_LOOKUP.search(text)
    return bool(on_topic) and not _SURVEY_NOUN.search(text)


def _closed_set(text: str) -> bool:
    return bool(_CLOSED_SET.search(text)) and not _LIST_NOUN.search(text)


def _matches(*patterns: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: any(p.search(text) for p in patterns)


# (rule name, predicate, use_sot, reason). The order is the policy: hard "normal" signals
# first (SoT must never touch code, math or structured output), then an explicit list ask,
# then soft "normal" signals that a mere list noun cannot override, then list nouns.
_Rule = tuple[str, Callable[[str], bool], bool, str]
_HARD_RULES: tuple[_Rule, ...] = (
    ("brevity", _matches(_BREVITY), False, "a short answer is asked for"),
    ("structured", _matches(_STRUCTURED), False, "asks for structured output or a tool call"),
    ("code", _matches(*_CODE), False, "asks for code"),
    ("math", _matches(*_MATH), False, "asks for math"),
    ("translate", _matches(_TRANSLATE), False, "asks for a translation"),
    ("extract", _matches(_EXTRACT), False, "asks to extract or transform given text"),
    ("domain", _domain, False, "a how-to or lookup in code, arithmetic or a language"),
    ("estimate", _matches(_ESTIMATE), False, "a count or step-by-step chain is one argument"),
    ("writing", _matches(*_WRITING), False, "asks for a piece of writing in one voice"),
)
_SOFT_RULES: tuple[_Rule, ...] = (
    ("closed_set", _closed_set, False, "a closed set with one right answer"),
    ("list_ask", _list_ask, True, "asks for several independent points"),
    ("roleplay", _matches(_ROLEPLAY), False, "role-play is one voice"),
    ("choice", _yes_no, False, "a yes/no or either-or question wants one argued position"),
    ("single_fact", _single_fact, False, "asks for a single fact"),
    ("list_noun", _matches(_LIST_NOUN), True, "asks about several things of one kind"),
    ("mechanism", _matches(_MECHANISM), False, "a process is one causal chain"),
)


def route_question(
    question: str,
    config: SoTConfig = DEFAULT_CONFIG,
    *,
    max_new_tokens: int | None = None,
    model_reply: str | None = None,
    suitability: Suitability | None = None,
) -> RouteDecision:
    """Route one question; after the hard rules, a readable `model_reply`, else the
    classifier's `suitability`, else the soft rules decide."""
    text = _one_line(question)
    decision = _decide(text, config, max_new_tokens, model_reply, suitability)
    logger.debug("route %r -> sot=%s (%s)", text[:80], decision.use_sot, decision.rule)
    return decision


def hard_route(question: str, config: SoTConfig = DEFAULT_CONFIG, max_new_tokens: int | None = None) -> RouteDecision | None:
    """The decision no verdict or classifier can change (no text, a short cap, a hard rule);
    None when the question is open. Callers use it to skip classifying what is decided."""
    text = _one_line(question)
    return _hard(text, config, max_new_tokens)


def system_route(system_prompt: str) -> RouteDecision | None:
    """The answer stays normal when the client's system prompt trips a hard rule ("Reply in
    JSON", "You write Python code", "Be concise"): it governs every answer, whatever the
    question. None when it leaves the question to decide. A persona or a language does not
    trip one; the soft rules are about questions and are not applied to it."""
    text = " ".join(system_prompt.split())
    for name, applies, use_sot, reason in _HARD_RULES:
        if not use_sot and applies(text):
            return RouteDecision(False, f"system_{name}", f"the system prompt: {reason}")
    return None


def quality_veto(question: str) -> RouteDecision | None:
    """A normal answer for a question whose shape suits SoT but whose SoT answer reads worse
    (mode "auto" only; None when nothing vetoes). The router above decides by the answer's
    shape, and its agreement with the shape labels is measured as such; this is the answer's
    quality, judged by blind readers on tuning questions: a changed premise (_COUNTERFACTUAL)."""
    text = _one_line(question)
    if any(pattern.search(text) for pattern in _COUNTERFACTUAL):
        return RouteDecision(False, "counterfactual",
                             "a changed premise: branches written apart invent consequences that contradict each other")  # fmt: skip
    return None


def _one_line(question: str) -> str:
    """The question with its whitespace runs joined into single spaces ("" for no text)."""
    return collapse_spaces(question) if isinstance(question, str) else ""


def _hard(text: str, config: SoTConfig, max_new_tokens: int | None) -> RouteDecision | None:
    if not any(ch.isalnum() for ch in text):
        return RouteDecision(False, "empty", "no question text")
    if max_new_tokens is not None and max_new_tokens < config.router_min_answer_tokens:
        return RouteDecision(
            False,
            "short_cap",
            f"max_new_tokens={max_new_tokens} < router_min_answer_tokens="
            f"{config.router_min_answer_tokens}: SoT loses on short answers",
        )
    for name, applies, use_sot, reason in _HARD_RULES:
        if applies(text):
            return RouteDecision(use_sot, name, reason)
    return None


def _decide(
    text: str,
    config: SoTConfig,
    max_new_tokens: int | None,
    model_reply: str | None,
    suitability: Suitability | None,
) -> RouteDecision:
    hard = _hard(text, config, max_new_tokens)
    if hard is not None:
        return hard
    if model_reply is not None:
        verdict = parse_route_reply(model_reply)
        if verdict is not None:
            return verdict
    if suitability is not None:
        return _classified(suitability)
    for name, applies, use_sot, reason in _SOFT_RULES:
        if applies(text):
            return RouteDecision(use_sot, name, reason)
    return RouteDecision(False, "default", "no list-shaped ask found")


def _classified(suitability: Suitability) -> RouteDecision:
    relation = ">=" if suitability.use_sot else "<"
    reason = (f"the question classifier gives P(list of points)={suitability.probability:.2f} "
              f"{relation} {suitability.threshold:.2f}")  # fmt: skip
    return RouteDecision(suitability.use_sot, "classifier", reason, "classifier")


_VERDICT = _rx(r"\b(list|direct|sot|normal|parallel|sequential)\b")
_YES_NO_REPLY = _rx(r"^\W*(yes|no)\b")  # small models often answer the question literally
_SOT_WORDS = {ROUTE_LIST.lower(), "sot", "parallel", "yes"}


def parse_route_reply(text: str) -> RouteDecision | None:
    """Read the model's one-word verdict from `route_prompt`; None when there is none."""
    if not isinstance(text, str):
        return None
    match = _VERDICT.search(text[:200]) or _YES_NO_REPLY.search(text)
    if match is None:
        return None
    word = match.group(1).lower()
    use_sot = word in _SOT_WORDS
    verdict = ROUTE_LIST if use_sot else ROUTE_DIRECT
    return RouteDecision(use_sot, "model", f"the model answered {verdict} ({word!r})", "model")


def evaluate(name_or_path: str, classifier: QuestionClassifier | None = None) -> RouterAgreement:
    """Agreement of the router (no model verdict, no length cap) with a question set's labels:
    the hard rules, then `classifier` when given, else the soft rules."""
    rows = load_labelled(name_or_path)
    return measure_agreement((_route_for_eval(r.question, classifier).use_sot, r.sot_suitable) for r in rows)


def _route_for_eval(question: str, classifier: QuestionClassifier | None) -> RouteDecision:
    decided = hard_route(question)
    if decided is not None or classifier is None:
        return decided or route_question(question)
    return route_question(question, suitability=classifier(question))


ROUTERS = ("classifier", "rules")
_USAGE = ("usage: python -m sglang_specsot.sot.router eval FILE.jsonl|NAME "
          "[--router classifier|rules] [--head HEAD.json]")  # fmt: skip


def _parse_eval_args(args: list[str]) -> tuple[str, str, str | None]:
    """(set, router, head path or None) from `eval SET [--router R] [--head PATH]`."""
    if len(args) < 2 or args[0] != "eval" or len(args) % 2:
        raise SystemExit(_USAGE)
    options = dict(zip(args[2::2], args[3::2]))
    if len(options) != len(args[2:]) // 2 or set(options) - {"--router", "--head"}:
        raise SystemExit(_USAGE)
    router, head = options.get("--router", "classifier"), options.get("--head")
    if router not in ROUTERS or (head is not None and router != "classifier"):
        raise SystemExit(_USAGE)
    return args[1], router, head


def main(
    argv: Sequence[str] | None = None,
    load_classifier: Callable[[str | None], QuestionClassifier] | None = None,
) -> None:
    """The eval command: its last stdout line is {"n", "accuracy", "precision", "recall"}.

    `--router classifier` (the default, as on the server) needs `load_classifier`, which the
    `python -m` entry below passes: loading the embedding model is not plain Python. It is
    given `--head`'s path (a head `router_classifier train --out` wrote), or None for the
    shipped head.
    """
    name, router, head = _parse_eval_args(list(sys.argv[1:] if argv is None else argv))
    try:
        load_labelled(name)  # a bad file is named before the embedding model loads
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if router == "classifier" and load_classifier is None:
        raise SystemExit("error: --router classifier needs the embedding model; run the command "
                         "as `python -m sglang_specsot.sot.router`, or pass --router rules")  # fmt: skip
    try:
        classifier = load_classifier(head) if router == "classifier" else None
        result = evaluate(name, classifier)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    line = {"n": result.total, "accuracy": round(result.accuracy, 4),
            "precision": round(result.precision, 4), "recall": round(result.recall, 4)}
    # The command's result, not library logging (hence no logger): one JSON line on stdout,
    # after one line saying which router was measured.
    described = "the hard rules, then the question classifier" if classifier else "the rules alone"
    sys.stdout.write(f"router: {described}\n{json.dumps(line)}\n")


# Only `python -m` runs this block, so the library stays plain Python (test_purity.py allows
# a non-pure import here and nowhere else).
if __name__ == "__main__":
    from sglang_specsot.models.router_classifier import load_classifier

    main(load_classifier=load_classifier)
