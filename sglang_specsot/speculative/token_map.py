"""A draft model's hot vocabulary: the token ids its LM head keeps (`--speculative-token-map`).

On CPU the draft model's LM head is a large share of each draft forward: Qwen2.5's 151,936-row
head is 136M of the 0.5B's ~490M weights, and the softmax runs over all of its output
(docs/benchmarks.md). Drafts only need the tokens that are likely, so the head keeps the most
frequent `size` of them (FR-Spec, Zhao et al. 2025, arXiv 2502.14856; SGLang's
`--speculative-token-map`, which EAGLE reads the same way). Verify still scores every token
with the target's full head, so output is unchanged; a token outside the map can only not be
drafted.

The frequencies mix sources that say nothing about the questions we measure on, each
normalised to a distribution first so that no source outweighs another by its length:
- English words (`wordfreq`'s "large" list: Wikipedia, subtitles, news, books, web text),
  each tokenised as it usually appears in running text (after a space, sometimes
  capitalised or at a line's start);
- Python's own standard library sources (code, comments, docstrings), for code answers;
- answers the project's models wrote to questions no benchmark reports on (those of
  `router_train` and `enumerated_asks*.jsonl`, kept in
  `benchmarks/token-map-corpus/answers.jsonl`), for chat formatting (lists, bold headers,
  line breaks).
Every special and added token is kept (an answer must be able to end in a draft); ids the
sources never produce fill the rest in id order (byte-level BPE merges earlier are more
frequent in the tokenizer's own corpus).

`python -m sglang_specsot.speculative.token_map build --tokenizer DIR --size N --out F.pt`
writes the map; `check` reports how much of a file of answers it covers.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import pathlib
import sysconfig
from collections.abc import Iterable

import torch

logger = logging.getLogger(__name__)

# The map shipped for Qwen2.5 (its 0.5B and 1.5B share one tokenizer): `shipped_map_path`.
SHIPPED = {"qwen2.5": "qwen2.5-49k.pt"}
# How a lower-case word of the word list appears in running text, and how often.
WORD_FORMS = (
    (lambda w: f" {w}", 0.8), (lambda w: f" {w.capitalize()}", 0.1), (str.capitalize, 0.05), (lambda w: w, 0.05),
)  # fmt: skip


def shipped_map_path(name: str) -> pathlib.Path:
    """The token map shipped in the package for tokenizer family `name` (see SHIPPED)."""
    if name not in SHIPPED:
        raise ValueError(f"no shipped token map {name!r}: choose one of {sorted(SHIPPED)} or build one (token_map build)")
    return pathlib.Path(__file__).resolve().parent.parent / "data" / "token_maps" / SHIPPED[name]


def resolve_map(value: str) -> str:
    """A token map given on a command line: a file (its absolute path), or the name of a map
    the package ships (SHIPPED)."""
    if pathlib.Path(value).is_file():
        return str(pathlib.Path(value).resolve())
    try:
        return str(shipped_map_path(value))
    except ValueError as exc:
        raise ValueError(f"--token-map {value!r} is not a file; {exc}") from None


def word_counts(tokenize, words: Iterable[tuple[str, float]]) -> collections.Counter:
    """Token frequencies of (word, frequency) pairs, each word in its running-text forms."""
    counts: collections.Counter = collections.Counter()
    for word, freq in words:
        for form, share in WORD_FORMS:
            for token in tokenize(form(word)):
                counts[token] += freq * share
    return counts


def text_counts(tokenize, texts: Iterable[str]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for text in texts:
        counts.update(tokenize(text))
    return counts


def mix(sources: list[collections.Counter]) -> collections.Counter:
    """Each source normalised to sum to 1, then added: no source outweighs another by size."""
    mixed: collections.Counter = collections.Counter()
    for counts in sources:
        total = sum(counts.values())
        for token, n in counts.items():
            mixed[token] += n / total
    return mixed


def hot_ids(counts: collections.Counter, size: int, vocab_size: int, always: Iterable[int] = ()) -> list[int]:
    """The `size` ids a draft head keeps, sorted: `always` first, then by frequency, then id order."""
    always = sorted(set(always))
    if not 0 < size <= vocab_size:
        raise ValueError(f"token map size {size} must be in 1..{vocab_size} (the tokenizer's vocabulary)")
    if len(always) > size:
        raise ValueError(f"token map size {size} is smaller than the {len(always)} special tokens it must keep")
    chosen = dict.fromkeys(always)
    for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= size:
            break
        if 0 <= token < vocab_size:
            chosen.setdefault(token)
    fill = iter(range(vocab_size))
    while len(chosen) < size:
        chosen.setdefault(next(fill))
    return sorted(chosen)


def check_token_map(hot: torch.Tensor, vocab_size: int) -> None:
    """A token map a draft head can be cut to: distinct ids of the vocabulary, in one dimension."""
    where = "--speculative-token-map"
    if hot.dim() != 1 or hot.numel() == 0:
        raise ValueError(f"{where}: expected a non-empty list of token ids, got shape {tuple(hot.shape)}")
    low, high = int(hot.min()), int(hot.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{where}: ids {low}..{high} outside the draft's vocabulary 0..{vocab_size - 1}")
    repeated = hot.numel() - torch.unique(hot).numel()
    if repeated:
        raise ValueError(f"{where}: {repeated} repeated token ids")


def stdlib_sources(limit: int | None = None) -> list[str]:
    """Python's standard library modules (top level), as text."""
    files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:limit]
    return [p.read_text(errors="ignore") for p in files]


def answers(paths: Iterable[str]) -> list[str]:
    """Texts from JSONL files (each line's "answer" or "text") or plain text files."""
    out = []
    for path in paths:
        text = pathlib.Path(path).read_text()
        if not path.endswith(".jsonl"):
            out.append(text)
            continue
        for line in text.splitlines():
            row = json.loads(line) if line.strip() else {}
            value = row.get("answer", row.get("text"))
            if isinstance(value, str) and value:
                out.append(value)
    return out


def english_words(limit: int) -> list[tuple[str, float]]:
    try:
        import wordfreq
    except ImportError as err:
        raise SystemExit("token_map build needs wordfreq for English word frequencies: pip install wordfreq") from err
    return list(wordfreq.get_frequency_dict("en", wordlist="large").items())[:limit]


def build(args) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    tokenize = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    corpus = sorted({a for a in answers(args.corpus)})  # one count per distinct answer
    sources = [word_counts(tokenize, english_words(args.words)), text_counts(tokenize, stdlib_sources(args.code_files))]
    if corpus:
        sources.append(text_counts(tokenize, corpus))
    special = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens]
    special += list(tokenizer.added_tokens_decoder)
    ids = hot_ids(mix(sources), args.size, len(tokenizer), always=special)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(ids, args.out)  # a list of ints: SGLang's load_token_map reads it as is
    print(json.dumps({"out": args.out, "size": len(ids), "vocab": len(tokenizer), "answers": len(corpus)}))


def check(args) -> None:
    """How much of the answers in FILE the map covers (a token it lacks cannot be drafted)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    hot = set(torch.load(args.map, weights_only=True))
    tokens = [t for text in answers(args.answers) for t in tokenizer.encode(text, add_special_tokens=False)]
    if not tokens:
        raise SystemExit(f"no answers in {args.answers}")
    covered = sum(t in hot for t in tokens)
    print(json.dumps({"tokens": len(tokens), "covered": round(covered / len(tokens), 4), "size": len(hot)}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sglang_specsot.speculative.token_map", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write a token map (a .pt list of ids)")
    b.add_argument("--tokenizer", required=True, help="a model directory with the tokenizer")
    b.add_argument("--size", type=int, default=49152, help="ids the draft head keeps (default: %(default)s)")
    b.add_argument("--out", required=True)
    b.add_argument("--corpus", nargs="*", default=[], help="JSONL answers or text files to count")
    b.add_argument("--words", type=int, default=150_000, help="English words to count (default: %(default)s)")
    b.add_argument("--code-files", type=int, default=400, help="stdlib modules to count (default: %(default)s)")
    c = sub.add_parser("check", help="the share of answers' tokens a map covers")
    c.add_argument("--tokenizer", required=True)
    c.add_argument("--map", required=True)
    c.add_argument("answers", nargs="+", help="JSONL answers or text files")
    args = parser.parse_args(argv)
    build(args) if args.command == "build" else check(args)


if __name__ == "__main__":
    main()
