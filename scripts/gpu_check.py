"""The prepared device check: SGLang and SPECSOT on one NVIDIA GPU that has no SGLang and no network.

The device has torch, triton and transformers (any versions: they are printed, not pinned) and
python3; everything else travels in the device call's 64 MiB with the repository's tree:

    prepare    (here, with network) fetch into .gpu-carry/ the sglang==0.5.23 wheel, slimmed, and
               the packages SGLang imports that such a machine lacks; print the carry and its size
               with the tree; fail over 64 MiB.
    run        (on the device; scripts/gpu_check.sh with no argument) install the carried wheels
               into a target folder, print versions and the GPU, then run the stages, each in its
               own process with its own time limit, appending JSON lines to OUT/gpu_check.jsonl.
    cpu-smoke  (here) the stages' code paths on the CPU in small shapes; with
               SPECSOT_GPU_SMOKE_ENGINES=1 the parity stage starts its engines on the CPU runtime.

The stages (gpu_stages.py, gpu_stages_cuda_path.py): `cost` (forward time by rows, plain and
verify, of a random-weight Qwen2.5-1.5B-shaped model); `masks` (our tree masks read by SGLang's
Triton extend kernel vs a dense reference); `tree` (own_capture_twin.py on the GPU: branching
trees at every tier through real CUDA graphs, graph vs eager logits, parity with plain); `vocab`
(a 152,064-row target, Qwen2.5-7B's, with a 151,936-row draft, the 0.5B's: SPECSOT vs plain);
`parity` (greedy SPECSOT vs plain through sglang.Engine: verify graphs per tier and eager, the
target as its own draft with and without graphs, accepted about as often as its next token
survives losing the prompt's first token; decode times; how verify steps ran; and the `syncs`
record: each SPECSOT engine's blocking syncs per step, torch.cuda.set_sync_debug_mode); `replay`
(gpu_stage_replay.py, issue 85: plain, STANDALONE, SPECSOT, SoT-only and SpecSoT end to end on
random Qwen2.5-1.5B and -7B shapes with a 0.5B-shaped draft, a trace folder's acceptance replayed;
5 minutes of its own, so it runs only where named: SPECSOT_GPU_STAGES=replay, with
SPECSOT_GPU_TRACES=DIR and SPECSOT_GPU_PAIRS=1.5b,7b). A stage that cannot run records what
blocked it. SPECSOT_GPU_STAGES=parity (say) runs only the stages named.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY_DIR = ".gpu-carry"
LIMIT_BYTES = 64 * 2**20  # what one device call carries: the tree plus the carried paths
SGLANG = "sglang==0.5.23"
# What SGLang 0.5.23 imports to build an Engine, a scheduler and a Qwen2 model runner on its CUDA
# path that a torch + triton + transformers image lacks (found by importing those modules with
# torch.cuda reporting a GPU), and those packages' own requirements. Pins are requirements/cpu.lock's.
WHEELS = (
    "annotated-types==0.8.0", "apache-tvm-ffi==0.1.11", "asttokens==3.0.2", "cffi==2.1.1",
    "compressed-tensors==0.18.0", "decorator==5.3.1", "dill==0.4.1", "distro==1.9.0",
    "executing==2.3.0", "fastapi==0.165.0", "gguf==0.19.0", "importlib-metadata==8.7.1",
    "ipython==9.18.1", "ipython-pygments-lexers==1.1.1", "jedi==0.20.1", "jiter==0.19.0",
    "loguru==0.7.3", "matplotlib-inline==0.2.2", "msgspec==0.22.0", "openai==2.8.0",
    "opentelemetry-api==1.45.2", "orjson==3.13.0", "parso==0.8.7", "partial-json-parser==0.2.1.1.post7",
    "pexpect==4.9.0", "prompt-toolkit==3.0.53", "ptyprocess==0.7.0", "pure-eval==0.2.4",
    "pybase64==1.5.1", "pycparser==3.12", "pydantic==2.14.3", "pydantic-core==2.50.4",
    "python-multipart==0.0.34", "pyzmq==27.3.0", "setproctitle==1.3.8", "sniffio==1.3.1",
    "soundfile==0.13.1", "stack-data==0.6.3", "starlette==1.10.0", "traitlets==5.16.1",
    "typing-inspection==0.4.5", "uvicorn==0.54.0", "wcwidth==0.9.4", "xgrammar==0.2.7",
)  # fmt: skip
# Left out of the sglang wheel: the Rust HTTP/gRPC/bench/multimodal extensions (18 MB; loaded
# lazily, only by the Rust server and multimodal processors) and the diffusion runtime.
SGLANG_SLIM_DROP = (
    "sglang/srt/rust_extensions/_server.", "sglang/srt/rust_extensions/_grpc.",
    "sglang/srt/rust_extensions/_bench.", "sglang/srt/rust_extensions/_multimodal.",
    "sglang/multimodal_gen/",
)  # fmt: skip
DEVICE_PYTHON = "3.12"  # the device image's python3
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux1_x86_64",
             "manylinux_2_5_x86_64")  # fmt: skip
# Seconds each stage may run on the device, in this order (a96a428 on an H200: cost 23 s, masks
# 13 s, parity 161 s with four engines, ~35 s an engine; tree and vocab start two engines each);
# with SETUP_S for the install and the environment probe they fill RUN_BUDGET_S, under
# gpu_check.sh's 7 minutes; `replay` fills such a run alone (OWN_RUN). The CPU smoke (Triton
# interpreted) gets SMOKE_SLOWER times as long.
STAGE_LIMITS = {"cost": 25, "masks": 20, "tree": 80, "vocab": 70, "parity": 200, "replay": 300}
OWN_RUN = ("replay",)  # stages that fill a run alone: run only where SPECSOT_GPU_STAGES names them
SETUP_S, RUN_BUDGET_S, SMOKE_SLOWER = 13, 408, 4
SITE = Path("/tmp/specsot-gpu-check/site")
SHIM = ROOT / "scripts" / "gpu_shim"
STAGES_PY = ROOT / "scripts" / "gpu_stages.py"


# --- what travels ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CarryReport:
    """Bytes that one device call carries: the tree (tracked and untracked-not-ignored files)
    plus every file under the carried paths."""

    tree_bytes: int
    tree_files: int
    carried: tuple[tuple[str, int], ...]  # (path relative to the root, bytes)
    limit: int = LIMIT_BYTES

    @property
    def total(self) -> int:
        return self.tree_bytes + sum(size for _, size in self.carried)

    @property
    def fits(self) -> bool:
        return self.total <= self.limit


def _git_files(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *args], cwd=root, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def tree_size(root: Path) -> tuple[int, int]:
    """(bytes, files) of what travels without being named: tracked plus untracked-not-ignored files."""
    paths = set(_git_files(root)) | set(_git_files(root, "--others", "--exclude-standard"))
    sizes = [os.lstat(root / p).st_size for p in paths if os.path.lexists(root / p)]
    return sum(sizes), len(sizes)


def carry_report(root: Path, carry: Path) -> CarryReport:
    files = sorted(p for p in carry.rglob("*") if p.is_file()) if carry.is_dir() else []
    tree_bytes, tree_files = tree_size(root)
    carried = tuple((str(p.relative_to(root)), p.stat().st_size) for p in files)
    return CarryReport(tree_bytes, tree_files, carried)


def print_carry(report: CarryReport) -> None:
    mib = 2**20
    for path, size in report.carried:
        print(f"  {size / mib:7.2f} MiB  {path}")
    print(f"  {report.tree_bytes / mib:7.2f} MiB  the tree ({report.tree_files} files)")
    verdict = "fits" if report.fits else "OVER THE LIMIT"
    print(f"carry total {report.total / mib:.2f} MiB of {report.limit / mib:.0f} MiB: {verdict}")


# --- prepare (here) --------------------------------------------------------------------------


def _have(carry: Path, requirement: str) -> bool:
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_').lower()}-{version}-"
    return any(w.name.lower().startswith(stem) for w in carry.glob("*.whl"))


def _download(requirement: str, dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", DEVICE_PYTHON, "--implementation", "cp", "-d", str(dest), requirement]  # fmt: skip
    for platform in (*PLATFORMS, "any"):
        cmd[-1:-1] = ["--platform", platform]
    subprocess.run(cmd, check=True)


def slim_sglang_wheel(src: Path, dest_dir: Path) -> Path:
    """Rewrite the sglang wheel without SGLANG_SLIM_DROP's files; RECORD lists what stays."""
    dest = dest_dir / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename.startswith(SGLANG_SLIM_DROP):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith(SGLANG_SLIM_DROP)).encode()
            zout.writestr(info, data)
    return dest


def prepare(root: Path = ROOT) -> int:
    carry = root / CARRY_DIR
    carry.mkdir(exist_ok=True)
    for requirement in WHEELS:
        if not _have(carry, requirement):
            print(f"prepare: fetching {requirement}", flush=True)
            _download(requirement, carry)
    if not _have(carry, SGLANG):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"prepare: fetching {SGLANG} and slimming it", flush=True)
            _download(SGLANG, Path(tmp))
            slim_sglang_wheel(next(Path(tmp).glob("sglang-*.whl")), carry)
    report = carry_report(root, carry)
    print(f"prepare: carry these with `carry: [\"{CARRY_DIR}\"]` and run `bash scripts/gpu_check.sh`")
    print_carry(report)
    if not report.fits:
        print(f"prepare: {report.total} bytes is over {report.limit}: the device call would refuse it", file=sys.stderr)
        return 2
    return 0


# --- run (on the device) ---------------------------------------------------------------------


def _sh(cmd: list[str], timeout: float = 30) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (out.stdout or out.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"


def _emit(out: Path, record: dict, line: str) -> None:
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(line, flush=True)


def install_carried(carry: Path, site: Path) -> dict:
    wheels = sorted(str(w) for w in carry.glob("*.whl"))
    missing = [r for r in (SGLANG, *WHEELS) if not _have(carry, r)]
    if missing:
        return {"ok": False, "error": f"{CARRY_DIR} lacks {missing}: run scripts/gpu_check.sh --prepare first"}
    site.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--upgrade", "--target", str(site), *wheels],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode:
        return {"ok": False, "error": (out.stdout + out.stderr)[-3000:]}
    _write_plugin_metadata(site)
    return {"ok": True, "wheels": len(wheels), "seconds": round(time.monotonic() - started, 1)}


def _write_plugin_metadata(site: Path) -> None:
    """The dist-info an editable install would give, so SGLang's plugin loader finds SPECSOT's
    entry point (group sglang.srt.plugins) with the repository itself on PYTHONPATH."""
    info = site / "sglang_specsot-0.1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-specsot\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nspecsot = sglang_specsot.plugin:register\n")


ENV_PROBE = ROOT / "scripts" / "gpu_env_probe.py"  # versions, the GPU, sgl_kernel and flashinfer


def environment_record(env: dict) -> dict:
    out = subprocess.run([sys.executable, str(ENV_PROBE)], env=env, capture_output=True, text=True, timeout=180)
    record = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-2000:]}
    record["driver"] = _sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    record["nvcc"] = _sh(["nvcc", "--version"]).splitlines()[-1:]
    return record


def stage_env(site: Path | None, smoke: bool) -> tuple[dict, dict]:
    """(environment of the stage processes, the environment record that decided it)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    path = [str(site)] if site else []
    env["PYTHONPATH"] = os.pathsep.join([*path, str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # SGLang's Rust radix TreeCore is built against the torch that sglang 0.5.23 pins; on a device
    # image with another torch it panics on the first insert (an ATen TypeMeta it does not know).
    # The Python TreeCore is SGLang's own fallback and computes the same tree.
    env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"
    if smoke and os.environ.get("SPECSOT_GPU_SMOKE_ENGINES") == "1":
        env["SGLANG_USE_CPU_ENGINE"] = "1"  # the parity stage's engines on SPECSOT's CPU runtime
    if smoke:
        env["TRITON_INTERPRET"] = "1"  # the Triton kernel through Triton's interpreter, on CPU tensors
    record = environment_record(env)
    if not smoke and record.get("sgl_kernel") != "installed":
        env["PYTHONPATH"] = os.pathsep.join([str(SHIM), env["PYTHONPATH"]])
        # Every BaseFusedOp (norms, activations, rotary) on its torch forward: no sgl-kernel op
        # and no JIT-compiled CUDA where a torch one exists (sglang/kernels/fused_op.py).
        env["SGLANG_FORCE_FUSED_OP_BACKEND"] = "torch"  # KernelBackend.TORCH (sglang/kernels/spec.py)
        # The stand-in has no package metadata: SGLang's own switch for the engine's
        # `assert_pkg_version("sglang-kernel", ...)` (utils/common.py, entrypoints/engine.py).
        env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] = "1"
        record["sgl_kernel_stand_in"] = str(SHIM.relative_to(ROOT))
    return env, record


def run_stage(name: str, out: Path, limit_s: float, env: dict, smoke: bool) -> None:
    """Run one stage in its own process group; record a timeout or a crash it could not record."""
    cmd = [sys.executable, "-u", str(STAGES_PY), name, "--out", str(out), "--limit", str(limit_s)] + (["--smoke"] if smoke else [])
    log = out.parent / f"{name}_stderr.log"
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(cmd, env=env, stderr=err, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # also when the run itself is stopped: a new session would outlive it
            _kill_group(proc)
    seconds = round(time.monotonic() - started, 1)
    tail = log.read_text(errors="replace")[-2500:]
    if rc != 0:
        status = "timeout" if rc is None else "crashed"
        record = {"stage": name, "status": status, "rc": rc, "seconds": seconds, "limit_s": limit_s,
                  "stderr_tail": tail}  # fmt: skip
        _emit(out, record, f"[{name}] {status} after {seconds} s (limit {limit_s} s); stderr tail:\n{tail}")
    elif _last_status(out, name) != "ok":
        # A stage that recorded its blocker: SGLang's own account of it (a scheduler process's
        # traceback) is in the stage's stderr, not in the exception the stage caught.
        _emit(out, {"stage": name, "stderr_tail": tail}, f"[{name}] stderr tail:\n{tail}")


def _kill_group(proc: subprocess.Popen) -> None:
    """End a process started in a session of its own, and whatever it started (SGLang's scheduler)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _last_status(out: Path, stage: str) -> str | None:
    statuses = [r.get("status") for r in _records(out) if r.get("stage") == stage and "status" in r]
    return statuses[-1] if statuses else None


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []


# What SGLang's CUDA path imports: the engine, the scheduler, Qwen2 and the Triton backend.
_SGLANG_IMPORTS = ("import sglang.srt.entrypoints.engine, sglang.srt.managers.scheduler, "
                   "sglang.srt.models.qwen2, sglang.srt.layers.attention.triton_backend")  # fmt: skip


def start_bare_import(env: dict) -> subprocess.Popen | None:
    """Import SGLang without the sgl_kernel stand-in, beside the stages: what blocks it bare."""
    if str(SHIM) not in env.get("PYTHONPATH", ""):
        return None
    bare = dict(env, PYTHONPATH=env["PYTHONPATH"].replace(str(SHIM) + os.pathsep, ""))
    bare.pop("SGLANG_FORCE_FUSED_OP_BACKEND", None)
    return subprocess.Popen([sys.executable, "-c", _SGLANG_IMPORTS], env=bare, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip


def finish_bare_import(proc: subprocess.Popen | None, out: Path) -> None:
    if proc is None:
        return
    try:
        _, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        _, err = proc.communicate()
    error = None if proc.returncode == 0 else _last_exception(err) or f"exit {proc.returncode}"
    said = "imports" if error is None else f"does not import: {error}"
    _emit(out, {"stage": "bare_import", "ok": error is None, "error": error},
          f"[bare_import] SGLang without the sgl_kernel stand-in {said}")  # fmt: skip


def _last_exception(stderr: str) -> str:
    """A traceback's exception line and the frame that raised it."""
    lines = [line.strip() for line in stderr.strip().splitlines()]
    frames = [line for line in lines if line.startswith("File ")]
    return (lines[-1] if lines else "") + (f" ({frames[-1]})" if frames else "")


def run(out_dir: Path, smoke: bool = False) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "gpu_check.jsonl"
    deadline = time.monotonic() + RUN_BUDGET_S * (SMOKE_SLOWER if smoke else 1)
    site = None
    if not smoke:
        installed = install_carried(ROOT / CARRY_DIR, SITE)
        _emit(out, {"stage": "install", **installed}, f"[install] {installed}")
        site = SITE if installed["ok"] else None
    env, record = stage_env(site, smoke)
    _emit(out, {"stage": "env", **record}, f"[env] {json.dumps(record)}")
    # `timeout` stops the run with SIGTERM: exit through the `finally`s that end the stages.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bare = start_bare_import(env)
    try:
        for name, limit in selected_stages(smoke).items():
            left = deadline - time.monotonic()
            if left < 10:
                record = {"stage": name, "status": "skipped", "reason": "run budget spent"}
                _emit(out, record, f"[{name}] skipped: the run's budget is spent")
                continue
            run_stage(name, out, min(limit, left), env, smoke)
        finish_bare_import(bare, out)
    finally:
        if bare is not None and bare.poll() is None:
            _kill_group(bare)
    print_summary(out)
    return 0


def selected_stages(smoke: bool = False) -> dict[str, float]:
    """The stages to run and their limits: all but OWN_RUN's, or those SPECSOT_GPU_STAGES names
    (a device rerun spends its minutes only on the stage that was blocked); longer on the CPU smoke."""
    names = [n for n in os.environ.get("SPECSOT_GPU_STAGES", "").split(",") if n]
    unknown = [n for n in names if n not in STAGE_LIMITS]
    if unknown:
        raise ValueError(f"SPECSOT_GPU_STAGES names unknown stages {unknown}; known: {', '.join(STAGE_LIMITS)}")
    chosen = names or [n for n in STAGE_LIMITS if n not in OWN_RUN]
    return {n: s * (SMOKE_SLOWER if smoke else 1) for n, s in STAGE_LIMITS.items() if n in chosen}


def print_summary(out: Path) -> None:
    """The cost table (rows x {plain, verify}) and each stage's status, from the JSON lines."""
    records = _records(out)
    cost = {(r["kind"], r["rows"]): r["ms_median"] for r in records if r.get("stage") == "cost" and "ms_median" in r}
    rows = sorted({rows for _, rows in cost})
    if rows:
        print("forward ms (median) by rows:   " + "  ".join(f"{r:>7}" for r in rows))
        for kind in ("plain", "verify"):
            cells = "  ".join(f"{cost[(kind, r)]:7.3f}" if (kind, r) in cost else f"{'-':>7}" for r in rows)
            print(f"  {kind:<28}" + cells)
    parity_runs = [run for r in records if r.get("stage") == "parity" for run in (r.get("runs") or {}).items()]
    for name, run in parity_runs:
        graphs = run.get("verify_graphs") or {}
        print(f"  {name:<28} decode {run['decode_s']:.3f} s ({run['speed_vs_plain']}x plain), accept "
              f"{[round(a or 0, 2) for a in run['accept_length']]}, replayed {graphs.get('replayed_by_width')}, "
              f"eager {graphs.get('eager_by_width')}, mismatched {run['mismatched_prompts']}")  # fmt: skip
    for r in (r for r in records if r.get("stage") == "replay" and "summary" in r):
        medians = {c: v["median_s"] for c, v in r["summary"]["configs"].items()}
        print(f"  replay {r['pair']:<6} median s per answer {medians}, SpecSoT/SoT-only {r['summary']['specsot_vs_sot']}")
    for r in records:
        if "status" in r:
            print(f"[{r['stage']}] {r['status']}" + (f": {r['blocker']}" if r.get("blocker") else ""))


def cpu_smoke() -> int:
    with tempfile.TemporaryDirectory(prefix="gpu-check-smoke-") as tmp:
        return run(Path(tmp), smoke=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="fetch the carried wheels into .gpu-carry/ and print the carry size")
    sub.add_parser("size", help="print the carry size of the tree and .gpu-carry/ as they are")
    run_parser = sub.add_parser("run", help="on the GPU machine: install the carried wheels, run the stages")
    run_parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/specsot-gpu-check/out")))
    sub.add_parser("cpu-smoke", help="the stages' code paths on this CPU, in small shapes")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare()
    if args.command == "size":
        report = carry_report(ROOT, ROOT / CARRY_DIR)
        print_carry(report)
        return 0 if report.fits else 2
    if args.command == "run":
        return run(args.out)
    return cpu_smoke()


if __name__ == "__main__":
    sys.exit(main())
