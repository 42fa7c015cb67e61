"""Convert a GGUF file into an ordinary Hugging Face checkpoint (bf16 safetensors, config, tokenizer).

Config, tokenizer and weights are read through transformers' GGUF reader; what it gets wrong or
leaves out for our models is fixed here:

* weights: dequantized to plain bf16 tensors, written without a quantization config;
* config.json: top-level `rope_theta` beside `rope_parameters`; Qwen's two end-of-sequence ids;
* tokenizer: SmolLM2's digit splitting, Qwen's NFC normalizer, llama.cpp's padding entries
  dropped, no `token_type_ids`, the chat template in tokenizer_config.json and chat_template.jinja.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_specsot.models.registry import ModelSpec

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedConfig

logger = logging.getLogger(__name__)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
MAX_SHARD_BYTES = 2 * 2**30
MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]  # no token_type_ids: decoder-only models
# llama.cpp token types (gguf.TokenType)
CONTROL, USER_DEFINED, UNUSED = 3, 4, 5
# Strings whose ids must survive the save/reload round trip unchanged (digits, NFD accent, code).
_PROBE = "Call f(12345) at 09:30 -- cafe\u0301 / caf\u00e9 \u2014 ok\n\tdef x(): return 1"


@dataclass(frozen=True, slots=True)
class GgufMeta:
    """The tokenizer facts we need from a GGUF's metadata that transformers does not hand back."""

    architecture: str  # "llama", "qwen2"
    pre: str  # llama.cpp pre-tokenizer name: "smollm", "qwen2", ...
    token_types: tuple[int, ...]  # one per token id; see the constants above
    chat_template: str
    special_ids: dict[str, int]  # "bos"/"eos"/"pad"/"unk" -> id, for those the file names
    context_length: int


def read_metadata(gguf: Path) -> GgufMeta:
    # transformers' own reader: far faster than gguf.GGUFReader on a large vocabulary
    from transformers.integrations.gguf.reader import read_gguf_metadata

    fields, _ = read_gguf_metadata(str(gguf), ("tokenizer.ggml.token_type",))
    special = {
        role: int(fields[f"tokenizer.ggml.{key}"])
        for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                          ("pad", "padding_token_id"), ("unk", "unknown_token_id"))
        if f"tokenizer.ggml.{key}" in fields
    }
    return GgufMeta(
        architecture=fields["general.architecture"],
        pre=fields["tokenizer.ggml.pre"],
        token_types=tuple(int(t) for t in fields["tokenizer.ggml.token_type"]),
        chat_template=fields["tokenizer.chat_template"],
        special_ids=special,
        context_length=int(fields[f"{fields['general.architecture']}.context_length"]),
    )


def convert_gguf(gguf: Path, out: Path, spec: ModelSpec) -> None:
    """Write the checkpoint for `spec` converted from `gguf` into the new directory `out`."""
    started = time.monotonic()
    out.mkdir(parents=True)
    meta = read_metadata(gguf)
    if meta.architecture != spec.family:
        raise ValueError(f"{gguf.name} holds a {meta.architecture!r} model, but {spec.name} is {spec.family!r}")
    tokens = save_tokenizer(gguf, out, meta)
    config = load_config(gguf, spec, meta, tokens)
    save_weights(gguf, config, out)
    save_config(config, out)
    make_readable(out)
    logger.info("converted %s in %.0f s", spec.name, time.monotonic() - started)


def make_readable(out: Path) -> None:
    """safetensors writes its files 0600; a checkpoint is read by other users' servers too."""
    for path in out.iterdir():
        path.chmod(0o644)


# ---- tokenizer -------------------------------------------------------------------------------


def fix_tokenizer_json(data: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    """Apply the tokenizer fixes to a `tokenizer.json` document built from the GGUF."""
    unused = {i for i, kind in enumerate(meta.token_types) if kind == UNUSED}
    # llama.cpp pads the vocabulary to the embedding size with "[PAD<id>]" entries; the original
    # tokenizers do not have them, and text can never produce them.
    data["model"]["vocab"] = {tok: i for tok, i in data["model"]["vocab"].items() if i not in unused}
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] not in unused]
    for token in data["added_tokens"]:
        token["special"] = meta.token_types[token["id"]] == CONTROL
    if meta.pre == "smollm":
        # llama.cpp splits every digit first for "smollm"; transformers' rebuild does not.
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ]}
    elif meta.pre == "qwen2":
        data["normalizer"] = {"type": "NFC"}
    else:
        raise ValueError(f"no tokenizer fixes known for GGUF pre-tokenizer {meta.pre!r} (know: smollm, qwen2)")
    return data


def save_tokenizer(gguf: Path, out: Path, meta: GgufMeta) -> list[str]:
    """Save the fixed tokenizer into `out`; returns its vocabulary by id (for the special ids)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    logger.info("building the tokenizer")
    # What `AutoTokenizer.from_pretrained(dir, gguf_file=...)` builds, without its extra full parse
    # of the file for the config (slow on a large vocabulary).
    architecture, tokenizer_dict, _ = get_gguf_tokenizer(str(gguf))
    rebuilt, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    data = fix_tokenizer_json(json.loads(rebuilt.to_str()), meta)
    backend = Tokenizer.from_str(json.dumps(data))
    tokens = [""] * backend.get_vocab_size()
    for token, index in backend.get_vocab().items():
        tokens[index] = token
    named = {f"{role}_token": tokens[i] for role, i in meta.special_ids.items() if i < len(tokens)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_input_names=MODEL_INPUT_NAMES,
        chat_template=meta.chat_template, clean_up_tokenization_spaces=False,
        model_max_length=meta.context_length, **named,
    )
    tokenizer.save_pretrained(out)
    finish_tokenizer_files(out, meta.chat_template)
    _check_saved_tokenizer(out, backend)
    return tokens


def finish_tokenizer_files(out: Path, chat_template: str) -> None:
    """Readers differ on where they look for the template, so it goes in both places."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(chat_template=chat_template, model_input_names=MODEL_INPUT_NAMES,
                  tokenizer_class="PreTrainedTokenizerFast", add_bos_token=False)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").write_text(chat_template)


def _check_saved_tokenizer(out: Path, backend) -> None:
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(out)
    got, want = reloaded(_PROBE)["input_ids"], backend.encode(_PROBE).ids
    assert got == want, f"the saved tokenizer in {out} encodes differently: {got} != {want}"
    assert "token_type_ids" not in reloaded(_PROBE), "token_type_ids must not be produced"


# ---- config ----------------------------------------------------------------------------------


def load_config(gguf: Path, spec: ModelSpec, meta: GgufMeta, tokens: list[str]) -> PreTrainedConfig:
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.architectures = [ARCHITECTURES[spec.family]]
    config.dtype = torch.bfloat16
    if spec.family == "qwen2":
        # A chat turn ends with <|im_end|>; a plain completion with <|endoftext|>. Both must stop.
        config.eos_token_id = [tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")]
    return config


def save_config(config: PreTrainedConfig, out: Path) -> None:
    from transformers import GenerationConfig

    config.save_pretrained(out)
    finish_config_json(out, config.rope_parameters["rope_theta"])
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(out)


def finish_config_json(out: Path, rope_theta: float) -> None:
    """Add top-level `rope_theta` and drop what a dense checkpoint must not carry."""
    path = out / "config.json"
    data = json.loads(path.read_text())
    data.pop("quantization_config", None)
    data.pop("_name_or_path", None)
    data.pop("_model_name_or_path", None)  # the GGUF's general.name, e.g. "... Instruct AWQ"
    # transformers 5 writes only `rope_parameters`; readers that look for `rope_theta` (SGLang's
    # older paths, other tools) would silently fall back to 10000.
    data["rope_theta"] = rope_theta
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ---- weights ---------------------------------------------------------------------------------


def save_weights(gguf: Path, config: PreTrainedConfig, out: Path) -> None:
    """Dequantize every tensor to bf16 and write them as safetensors shards."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):  # only the names and shapes are needed
        skeleton = AutoModelForCausalLM.from_config(config)
    expected = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    logger.info("dequantizing %d tensors to bf16", len(expected))
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton,
                                   torch_dtype=torch.bfloat16)["tensors"]
    check_tensors(tensors, expected)
    write_safetensors({name: tensors.pop(name) for name in expected}, out)


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    """Every parameter present, dense bf16, and shaped as the model expects (packed blocks are not)."""
    import torch

    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"GGUF tensors do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, tensor in tensors.items():
        if tensor.dtype != torch.bfloat16 or tuple(tensor.shape) != expected[name]:
            raise ValueError(
                f"{name}: got {tensor.dtype} {tuple(tensor.shape)}, expected bfloat16 {expected[name]} "
                "(still quantized?)"
            )


def write_safetensors(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """`model.safetensors`, or numbered shards plus an index; tensors are freed as they are written."""
    from safetensors.torch import save_file

    shards = _plan_shards(tensors, max_shard_bytes)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map, total = {}, 0
    for file_name, shard in zip(names, shards, strict=True):
        part = {name: tensors.pop(name).contiguous() for name in shard}
        total += sum(t.numel() * t.element_size() for t in part.values())
        save_file(part, out / file_name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file_name))
        del part
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _plan_shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards
