"""Agreement of router decisions with reference labels: labelled sets, confusion matrix, rates."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class RouterAgreement:
    """Confusion matrix of predicted vs labelled SoT suitability ("positive" = use SoT)."""

    true_pos: int
    false_pos: int
    false_neg: int
    true_neg: int

    @property
    def total(self) -> int:
        return self.true_pos + self.false_pos + self.false_neg + self.true_neg

    @property
    def accuracy(self) -> float:
        return (self.true_pos + self.true_neg) / self.total if self.total else 0.0

    @property
    def precision(self) -> float:
        predicted = self.true_pos + self.false_pos
        return self.true_pos / predicted if predicted else 0.0

    @property
    def recall(self) -> float:
        actual = self.true_pos + self.false_neg
        return self.true_pos / actual if actual else 0.0


def measure_agreement(pairs: Iterable[tuple[bool, bool]]) -> RouterAgreement:
    """Count (predicted, label) pairs into a confusion matrix."""
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for predicted, label in pairs:
        counts[(bool(predicted), bool(label))] += 1
    return RouterAgreement(
        true_pos=counts[(True, True)],
        false_pos=counts[(True, False)],
        false_neg=counts[(False, True)],
        true_neg=counts[(False, False)],
    )


# The package's question sets, found by file path: sot/ may not import sglang_specsot.data
# (the purity test allows only pure packages), and reading a file needs no import.
_DATA_DIR = Path(__file__).resolve().parent.parent / "data"
# Labelled sets whose question texts keep their sources' licences: they live in a checkout's
# third_party/ (provenance and licences in each folder's README), not in the wheel.
THIRD_PARTY_DIR = _DATA_DIR.parent.parent / "third_party"
EXTERNAL_SETS = {  # name: (folder under third_party/, file, the texts' licence)
    "sot_lima": ("sot-router-labels", "lima.jsonl", "licensed non-commercial"),
    "sot_wizardlm": ("sot-router-labels", "wizardlm.jsonl", "licensed non-commercial"),
    "dolly_categories": ("dolly-categories", "dolly.jsonl", "CC BY-SA 3.0"),
}


@dataclass(frozen=True, slots=True)
class LabelledQuestion:
    """One line of a labelled question set: the question and whether SoT suits it."""

    question: str
    sot_suitable: bool


def labelled_set_path(name_or_path: str | Path) -> Path:
    """A named set shipped in sglang_specsot/data (e.g. "vicuna80"), one of the third-party
    sets in a checkout's third_party/ (EXTERNAL_SETS), or a .jsonl file path."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if str(name_or_path) in EXTERNAL_SETS:
        folder, file, licence = EXTERNAL_SETS[str(name_or_path)]
        external = THIRD_PARTY_DIR / folder / file
        if not external.is_file():
            raise ValueError(
                f"question set {str(name_or_path)!r} is not installed: it lives in a checkout of "
                f"sglang-specsot at third_party/{folder}/ (its question texts are {licence}, "
                f"so the wheel leaves it out); run from a checkout or pass the file's path"
            )
        return external
    named = _DATA_DIR / f"{name_or_path}.jsonl"
    if named.is_file():
        return named
    names = sorted([p.stem for p in _DATA_DIR.glob("*.jsonl")] + list(EXTERNAL_SETS))
    raise ValueError(
        f"no question set {str(name_or_path)!r}: give the path of a .jsonl file with "
        f'{{"question": str, "sot_suitable": bool}} lines, or one of the names {names}'
    )


def load_labelled(name_or_path: str | Path) -> list[LabelledQuestion]:
    """Read a labelled set; a bad line raises one ValueError naming the file and line."""
    path = labelled_set_path(name_or_path)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            rows.append(_parse_line(line, f"{path}:{number}"))
    if not rows:
        raise ValueError(f"{path}: no questions; expected one JSON object a line")
    return rows


def _parse_line(line: str, where: str) -> LabelledQuestion:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    question, label = row.get("question"), row.get("sot_suitable")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f'{where}: needs a non-empty string "question", got {question!r}')
    if not isinstance(label, bool):
        raise ValueError(f'{where}: needs a boolean "sot_suitable" (true/false), got {label!r}')
    return LabelledQuestion(question, label)
