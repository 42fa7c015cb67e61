"""A tiny random-weight Llama (about 1M parameters) with a BPE tokenizer trained here, for fast tests.

The tokenizer is trained with the `tokenizers` library on a fixed English corpus built into this
file, so the same arguments always give byte-identical files. It is laid out like SmolLM2's
(digits split, byte-level BPE, ChatML special tokens and chat template), so code that handles the
real models handles this one the same way.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_specsot.models.convert import (
    MODEL_INPUT_NAMES,
    finish_config_json,
    finish_tokenizer_files,
    make_readable,
)

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ROPE_THETA = 10000.0

# A small, varied English corpus: answers in point form (what SoT produces), prose, numbers and
# a little code, so the merges cover the kinds of text the tests feed in.
CORPUS = """\
Here are five tips for staying healthy. 1. Drink enough water every day. 2. Eat fruit and
vegetables with every meal. 3. Walk for at least thirty minutes. 4. Sleep seven to eight hours.
5. Take short breaks from the screen and stretch your back, neck and shoulders.
Regular exercise improves cardiovascular health, builds muscle strength and flexibility, helps
you manage your weight, lifts your mood and reduces stress. It also helps you sleep better.
The skeleton of an answer lists the main points first. Then each point is expanded on its own,
in parallel, and the expanded points are joined into the final answer.
To learn a new language: practice a little every day, listen to native speakers, read simple
books, keep a notebook of new words, and do not be afraid of making mistakes.
A good study plan has clear goals, a fixed schedule, short sessions with breaks, regular review,
and a way to test yourself. Sleep and food matter as much as the hours you spend at the desk.
The train leaves at 09:30 and arrives at 14:45. The ticket costs 27 dollars, or 19 with a card.
In 2024 the city planted 3,500 trees; in 2025 it planted 4,200 more along 12 new streets.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, 1))

class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. What is the
best way to save money? Make a budget, track what you spend, cook at home, cancel the services
you do not use, and put a part of every pay check into a savings account before you spend it.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered more than red
light because it has a shorter wavelength. At sunset the light travels through more air, so the
sky turns red and orange. Water boils at 100 degrees Celsius at sea level.
How do I write a clear email? Start with a short subject, say what you need in the first line,
keep the paragraphs short, use a list for several questions, and end with the next step.
Good habits for programmers: write small functions, name things clearly, test your code, read
the error message, commit often, and ask for a review. Keep it simple; explain why, not what.
Answer: 1. Plan ahead. 2. Start early. 3. Focus on one thing. 4. Review and improve. 5. Rest.
The meeting is on Monday, Tuesday, Wednesday, Thursday or Friday, in January, March or June.
Thank you very much! You are welcome. Please let me know if you have any other questions.
Travel tips: pack light, check the weather, carry a copy of your passport, learn a few local
phrases, keep some cash, and leave room in your plans for the unexpected. Gardens need sunlight,
good soil, and water in the morning; tomatoes, beans and herbs are easy for beginners.
A computer stores numbers in binary. The processor fetches an instruction, decodes it, executes
it, and writes back the result; memory, storage and the network are far slower than the cache.
if x > 0 and y < 100:
    result = [n * 2 for n in values if n % 3 == 0]
else:
    raise ValueError("expected a positive number")
Summary: the report compares three options by cost, speed and risk, and recommends the second.
Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside green leaves.
The history of the printing press shows how a new technology can spread knowledge quickly.
"""


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Shape of the tiny model; the defaults give about 1.0M parameters."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    seed: int = 0
    dtype: str = "bfloat16"  # the converted real models are bf16 too
    # Llama's 0.02 gives near-tied logits (greedy parity then hinges on rounding) and outputs that
    # fall into 3-4 token loops; at 0.1 greedy text is varied and its argmax margins are wide.
    init_std: float = 0.1

    def __post_init__(self) -> None:
        if self.vocab_size < 256 + len(SPECIAL_TOKENS) + 16:
            raise ValueError(f"vocab_size={self.vocab_size} is too small: the byte alphabet alone is 256 tokens")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must divide by num_heads={self.num_heads}, "
                f"and num_heads by num_kv_heads={self.num_kv_heads}"
            )
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype={self.dtype!r}: use bfloat16, float16 or float32")

    @property
    def intermediate_size(self) -> int:
        """About 8/3 of hidden, rounded up to a multiple of 32, as Llama sizes its MLP."""
        return -(-self.hidden_size * 8 // 3 // 32) * 32


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer (digits split first, like SmolLM2's) trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def build_tiny_model(out_dir: str | Path, spec: TinySpec | None = None, **overrides) -> Path:
    """Write the tiny checkpoint into `out_dir` (new or empty) and return it.

    `overrides` are TinySpec fields, e.g. `build_tiny_model(d, seed=1, num_layers=2)`.
    """
    from dataclasses import replace

    spec = replace(spec or TinySpec(), **overrides)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; the tiny model is written only into a new or empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".tmp-{out.name}-") as tmp:
        staging = Path(tmp) / "model"
        _write_checkpoint(staging, spec)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    logger.info("tiny model (%s) written to %s", asdict(spec), out)
    return out


def _write_checkpoint(out: Path, spec: TinySpec) -> None:
    from transformers import PreTrainedTokenizerFast

    backend = train_tokenizer(spec.vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[2],
        pad_token=SPECIAL_TOKENS[0], unk_token=None, chat_template=CHAT_TEMPLATE,
        model_input_names=MODEL_INPUT_NAMES, clean_up_tokenization_spaces=False, model_max_length=4096,
    )
    model = _random_model(spec, [backend.token_to_id(t) for t in SPECIAL_TOKENS], backend.get_vocab_size())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    finish_config_json(out, ROPE_THETA)
    finish_tokenizer_files(out, CHAT_TEMPLATE)
    make_readable(out)


def _random_model(spec: TinySpec, special_ids: list[int], tokenizer_size: int):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    endoftext, _, im_end = special_ids
    config = LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False,  # tied random weights mostly echo the last token
        bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext,
        architectures=["LlamaForCausalLM"], initializer_range=spec.init_std,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    with torch.no_grad():
        # Rows past the tokenizer's ids are padding, as a real checkpoint's (Qwen2.5 pads its
        # 151,665 ids to 151,936 or 152,064): zero logits, never the greedy choice.
        model.lm_head.weight[tokenizer_size:] = 0
    model.generation_config = GenerationConfig(bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext)
    return model


def cut_vocabulary(model_dir: str | Path, out_dir: str | Path, vocab_size: int) -> Path:
    """A copy of the tiny model at `model_dir` with only its first `vocab_size` embedding and
    LM-head rows, on the same tokenizer: a draft whose vocabulary is a prefix of the model's
    (as Qwen2.5-0.5B's 151,936 of the 7B's 152,064), agreeing with it on every id it has."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    src, out = Path(model_dir), Path(out_dir)
    shutil.copytree(src, out)
    weights = load_file(out / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name] = weights[name][:vocab_size].contiguous()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["vocab_size"] = vocab_size
    (out / "config.json").write_text(json.dumps(config, indent=2))
    make_readable(out)
    return out
