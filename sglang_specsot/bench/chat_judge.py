"""A pairwise judge behind any OpenAI-compatible chat endpoint (`--judge-url`), given a rubric.

The same prompt serves a small local model (asked for one word) and a strong remote one (which
may reason first and end on "Verdict: A"): the reply's last "Verdict:" wins, else its first
A / B / tie.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_specsot.bench.cells import post_json
from sglang_specsot.bench.metrics import parse_verdict

ANSWER_CHARS = 3000  # each answer is cut to this many characters to keep the prompt bounded
# The rubric alone: the chat judge's prompt and the blind readers' instructions (bench/blind.py).
RUBRIC = """Judge them on this rubric, in this order:
1. Correct: no factual errors, no wrong reasons.
2. Complete: covers what the question asks; an answer that stops early or leaves out ideas loses.
3. Keeps the premise: answers the question as asked, without inverting or ignoring its situation.
4. No repetition: does not repeat the same point or restate titles and the question.
5. Reads as one answer: coherent and grammatical, not pieces glued together.
Length alone is not quality, and the order of the answers does not matter.
An answer to a different question is wrong."""
RUBRIC_PROMPT = """You are a careful, strict judge. Compare two answers to the user's question.

[Question]
{question}

[Answer A]
{a}

[Answer B]
{b}

""" + RUBRIC + """

End your reply with one line: "Verdict: A", "Verdict: B" or "Verdict: tie"."""

_VERDICT = re.compile(r"verdict\s*:?\s*\**\s*(A|B|tie)\b", re.IGNORECASE)


def read_verdict(text: str) -> str | None:
    """'A', 'B' or 'tie' from a judge's reply: its last "Verdict: X", else its first such word."""
    found = _VERDICT.findall(text)
    if found:
        word = found[-1]
        return "tie" if word.lower() == "tie" else word.upper()
    return parse_verdict(text)


@dataclass(frozen=True, slots=True)
class ChatJudge:
    """Calls `url`/v1/chat/completions with the rubric prompt; greedy, so a verdict repeats."""

    url: str  # the endpoint's base, e.g. http://127.0.0.1:30000 (a trailing /v1 is accepted)
    model: str = "default"  # the endpoint's model name (SGLang serves any name as its model)
    max_tokens: int = 8  # one word for a small judge; give a reasoning judge a few hundred
    timeout: float = 300.0

    def __call__(self, question: str, a: str, b: str) -> str | None:
        return read_verdict(self.reply(question, a, b))

    def reply(self, question: str, a: str, b: str) -> str:
        prompt = RUBRIC_PROMPT.format(question=question, a=a[:ANSWER_CHARS], b=b[:ANSWER_CHARS])
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0, "max_tokens": self.max_tokens}  # fmt: skip
        out = post_json(chat_route(self.url), body, self.timeout)
        if not isinstance(out, dict) or not out.get("choices"):
            raise ValueError(f"the judge at {self.url} did not answer with chat choices: {str(out)[:200]}")
        return out["choices"][0]["message"].get("content") or ""


def chat_route(url: str) -> str:
    """The chat-completions URL under a base URL given with or without /v1."""
    base = url.rstrip("/")
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
