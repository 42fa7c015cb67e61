"""The prepared device check (scripts/gpu_check.sh): its carry arithmetic, its command line, the
slimmed sglang wheel, and the torch stand-in for sgl_kernel it puts on a GPU machine's path."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path, package_dir: Path | None = None):
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(package_dir)] if package_dir else None
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # relative imports and dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


gpu_check = _load("specsot_gpu_check", ROOT / "scripts" / "gpu_check.py")
_load("specsot_gpu_stages", ROOT / "scripts" / "gpu_stages.py")  # puts scripts/ on sys.path for its stages
import gpu_random_qwen2  # noqa: E402
import gpu_stage_cost  # noqa: E402
import gpu_stage_parity  # noqa: E402
cuda_twin = _load("specsot_cuda_draft_twin", ROOT / "scripts" / "cuda_draft_twin.py")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def _write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_carry_counts_tracked_and_untracked_files_and_the_carry_not_the_ignored(tmp_path):
    _git(tmp_path, "init", "-q")
    _write(tmp_path / ".gitignore", 0)
    (tmp_path / ".gitignore").write_text("/.gpu-carry/\n/ignored.bin\n")
    _write(tmp_path / "tracked.py", 100)
    _git(tmp_path, "add", ".gitignore", "tracked.py")
    _write(tmp_path / "new" / "untracked.txt", 50)  # untracked, not ignored: it travels
    _write(tmp_path / "ignored.bin", 10_000)  # ignored and not carried: it stays
    _write(tmp_path / ".gpu-carry" / "a.whl", 200)
    _write(tmp_path / ".gpu-carry" / "sub" / "b.whl", 300)

    report = gpu_check.carry_report(tmp_path, tmp_path / ".gpu-carry")

    gitignore = len("/.gpu-carry/\n/ignored.bin\n")
    assert (report.tree_bytes, report.tree_files) == (100 + 50 + gitignore, 3)
    assert dict(report.carried) == {".gpu-carry/a.whl": 200, ".gpu-carry/sub/b.whl": 300}
    assert report.total == 650 + gitignore and report.fits
    over = gpu_check.CarryReport(report.tree_bytes, report.tree_files, report.carried, limit=600)
    assert not over.fits


def test_no_carry_folder_is_the_tree_alone(tmp_path):
    _git(tmp_path, "init", "-q")
    _write(tmp_path / "a.py", 7)
    _git(tmp_path, "add", "a.py")
    report = gpu_check.carry_report(tmp_path, tmp_path / ".gpu-carry")
    assert (report.total, report.carried, report.limit) == (7, (), 64 * 2**20)


def test_the_repository_tree_leaves_room_for_the_wheels():
    tree_bytes, files = gpu_check.tree_size(ROOT)
    assert files > 0 and tree_bytes < 16 * 2**20, f"the tree alone is {tree_bytes / 2**20:.1f} MiB"


def test_help_names_every_mode():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--help"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    for mode in ("prepare", "run", "cpu-smoke", "size"):
        assert mode in out.stdout


def test_an_unknown_argument_is_refused():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--bogus"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "--bogus" in out.stderr


def test_wheels_are_pinned_once_each():
    names = [w.split("==")[0] for w in gpu_check.WHEELS]
    assert all("==" in w for w in gpu_check.WHEELS) and len(names) == len(set(names))
    assert "sglang" not in names and "torch" not in names  # sglang is slimmed; torch is there


def test_slim_wheel_drops_the_listed_files_and_their_record_lines(tmp_path):
    src = tmp_path / "in" / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    src.parent.mkdir()
    kept, dropped = "sglang/srt/server_args.py", "sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so"
    record = f"{kept},sha256=a,1\n{dropped},sha256=b,2\nsglang-0.5.23.dist-info/RECORD,,\n"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr(kept, "x = 1\n")
        z.writestr(dropped, b"\0" * 64)
        z.writestr("sglang/multimodal_gen/runtime/a.py", "y = 2\n")
        z.writestr("sglang-0.5.23.dist-info/RECORD", record)
    out = gpu_check.slim_sglang_wheel(src, tmp_path)
    with zipfile.ZipFile(out) as z:
        assert sorted(z.namelist()) == sorted([kept, "sglang-0.5.23.dist-info/RECORD"])
        assert dropped not in z.read("sglang-0.5.23.dist-info/RECORD").decode()


def test_verify_rows_group_by_request_and_plain_rows_are_requests():
    plan = gpu_stage_cost.DEVICE_COST
    assert gpu_stage_cost._layout("plain", 64, plan) == (64, 1)
    assert gpu_stage_cost._layout("verify", 64, plan) == (16, 4)
    assert gpu_stage_cost._layout("verify", 2, plan) == (1, 2)


def test_parity_prompts_are_fixed_and_in_the_vocabulary():
    plan = gpu_stage_parity.DEVICE_PARITY
    prompts = gpu_stage_parity.parity_prompts(plan)
    assert prompts == gpu_stage_parity.parity_prompts(plan)
    assert len(prompts) == plan.prompts and all(len(p) == plan.prompt_len for p in prompts)
    assert all(0 <= t < plan.model.vocab for p in prompts for t in p)



def _smoke_model():
    return gpu_random_qwen2.random_qwen2(gpu_random_qwen2.SMOKE_MODEL, torch.float32, "cpu")


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids), eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_the_smoke_model_answers_in_more_than_one_token():
    # A model that repeats one token hides a draft that reads the wrong row: any row gives it.
    model = _smoke_model()
    for prompt in gpu_stage_parity.parity_prompts(gpu_stage_parity.SMOKE_PARITY):
        assert len(set(_greedy(model, prompt, 16))) > 4


def test_first_token_agreement_is_the_next_token_without_the_first_one_position_by_position():
    model, plan = _smoke_model(), gpu_stage_parity.SMOKE_PARITY
    prompts = gpu_stage_parity.parity_prompts(plan)
    outputs = [_greedy(model, p, 12) for p in prompts]
    agreeing, positions = gpu_stage_parity.first_token_agreement(model, prompts, outputs)
    # The same, one context at a time: with it and without its first token (positions from 0).
    want = 0
    with torch.no_grad():
        for prompt, output in zip(prompts, outputs):
            seq = prompt + output
            for t in range(len(prompt), len(seq)):
                full = model(torch.tensor([seq[:t]])).logits[0, -1].argmax().item()
                ahead = model(torch.tensor([seq[1:t]]), position_ids=torch.arange(t - 1)[None]).logits[0, -1].argmax().item()
                want += full == ahead
    assert (agreeing, positions) == (want, 24)
    assert 0 < agreeing < positions  # this model's next token does hinge on the first one


def test_a_self_draft_short_of_the_first_token_agreement_is_named():
    depth = {"model": {"reached": [30, 15, 5], "accepted": [15, 5, 2]}}  # 22 of 50
    assert gpu_stage_parity.self_draft_shortfall(depth, expected=0.5) is None
    assert "22 of 50 drafts accepted (0.44)" in gpu_stage_parity.self_draft_shortfall(depth, expected=0.7)
    assert gpu_stage_parity.self_draft_shortfall({}, expected=0.5) == "it never drafted"

# --- the torch stand-in for sgl_kernel (scripts/gpu_shim), on CPU tensors --------------------


@pytest.fixture(scope="module")
def shim():
    package = ROOT / "scripts" / "gpu_shim" / "sgl_kernel"
    module = _load("specsot_gpu_shim_sgl_kernel", package / "__init__.py", package)
    yield module
    for name in [n for n in sys.modules if n.startswith("specsot_gpu_shim_sgl_kernel")]:
        del sys.modules[name]


def test_norms_match_torch(shim):
    x, residual, w = torch.randn(5, 16), torch.randn(5, 16), torch.randn(16)
    assert torch.allclose(shim.rmsnorm(x, w, 1e-6), F.rms_norm(x, (16,), w, 1e-6), atol=1e-5)
    assert torch.allclose(shim.gemma_rmsnorm(x, w, 1e-6), F.rms_norm(x, (16,), 1 + w, 1e-6), atol=1e-5)
    xx, rr = x.clone(), residual.clone()
    shim.fused_add_rmsnorm(xx, rr, w, 1e-6)  # in place: residual += x, x = norm(residual)
    assert torch.equal(rr, x + residual)
    assert torch.allclose(xx, F.rms_norm(x + residual, (16,), w, 1e-6), atol=1e-5)


def test_activations_match_torch_and_write_out(shim):
    x = torch.randn(3, 8)
    out = torch.empty(3, 4)
    assert shim.silu_and_mul(x, out) is out
    assert torch.allclose(out, F.silu(x[:, :4]) * x[:, 4:])
    assert torch.allclose(shim.gelu_tanh_and_mul(x), F.gelu(x[:, :4], approximate="tanh") * x[:, 4:])


def test_ops_a_dense_model_never_calls_raise_naming_themselves(shim):
    with pytest.raises(NotImplementedError, match="moe_sum_reduce"):
        shim.moe_sum_reduce(torch.zeros(1))
    with pytest.raises(NotImplementedError, match="kvcacheio.transfer_kv_direct"):
        shim.kvcacheio.transfer_kv_direct()
    assert shim.utils.is_arch_support_pdl() is False


def test_a_bare_import_failure_is_reported_as_its_exception_and_frame():
    stderr = 'Traceback (most recent call last):\n  File "a.py", line 3, in <module>\n    import x\n' \
             "ModuleNotFoundError: No module named 'sgl_kernel'\n"
    assert gpu_check._last_exception(stderr) == (
        "ModuleNotFoundError: No module named 'sgl_kernel' (File \"a.py\", line 3, in <module>)"
    )


# --- scripts/cuda_draft_twin.py: its edits and verdict (the run itself is a long-tier test) ----


def test_the_twins_edits_apply_once_each_to_the_installed_sglang():
    cuda_twin.check_edits(cuda_twin.installed_sglang())  # raises naming the edit SGLang moved
    assert set(cuda_twin.BRANCHES) == {"draft_positions", "draft_extend_layout", "draft_topk1", "draft_extend_inputs"}


def test_the_twin_fails_unless_every_branch_ran_and_its_drafts_are_the_cpu_runtimes():
    depth = {"extend": {"reached": [31, 19], "accepted": [19, 10]}}
    twin = {"output_ids": [[1, 2]], "plain_output_ids": [[1, 2]], "acceptance_by_depth": depth}
    ran = dict.fromkeys(cuda_twin.BRANCHES, 3)
    assert cuda_twin.verdict(twin, {"acceptance_by_depth": depth}, ran) is None
    assert "never ran" in cuda_twin.verdict(twin, {"acceptance_by_depth": depth}, {**ran, "draft_topk1": 0})
    other = {"extend": {"reached": [36, 13], "accepted": [13, 8]}}
    assert "other drafts" in cuda_twin.verdict(twin, {"acceptance_by_depth": other}, ran)
    assert "differs from plain on prompts [0]" in cuda_twin.verdict(
        {**twin, "output_ids": [[1, 3]]}, {"acceptance_by_depth": depth}, ran)
