"""The device check's stages on SGLang's CUDA path (scripts/gpu_stages_cuda_path.py,
scripts/gpu_sync_count.py, the GPU mode of scripts/own_capture_twin.py): their budget, their
pure logic and the sync counter's plumbing, on the CPU. Their runs need a GPU (or, for the
smoke, minutes): `scripts/gpu_check.sh --cpu-smoke`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_check  # noqa: E402
import gpu_stage_syncs  # noqa: E402
import gpu_stages_cuda_path as cuda_path  # noqa: E402
import gpu_sync_count  # noqa: E402
import own_capture_stand_ins as stand_ins  # noqa: E402
import own_capture_twin as twin  # noqa: E402


def test_the_stage_limits_and_the_setup_fill_the_run_budget_under_the_scripts_timeout():
    assert list(gpu_check.STAGE_LIMITS) == ["cost", "masks", "tree", "vocab", "parity", "replay"]
    shared = [s for n, s in gpu_check.STAGE_LIMITS.items() if n not in gpu_check.OWN_RUN]  # replay runs alone
    assert sum(shared) + gpu_check.SETUP_S <= gpu_check.RUN_BUDGET_S
    timeout = int(re.search(r"timeout -k \d+ (\d+) ", (SCRIPTS / "gpu_check.sh").read_text()).group(1))
    assert gpu_check.RUN_BUDGET_S < timeout <= 7 * 60
    smoke = gpu_check.selected_stages(smoke=True)
    assert smoke["tree"] == gpu_check.STAGE_LIMITS["tree"] * gpu_check.SMOKE_SLOWER


def test_the_stages_script_takes_the_new_stages_and_a_limit():
    out = subprocess.run([sys.executable, str(SCRIPTS / "gpu_stages.py"), "--help"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and "tree,vocab" in out.stdout and "--limit" in out.stdout


# --- the twin's GPU mode -------------------------------------------------------------------------


def test_on_a_gpu_the_twin_installs_the_test_mode_and_no_stand_in():
    cpu, cuda = stand_ins.patches({"SPECSOT_OWN_CAPTURE_TWIN": "1"}), stand_ins.patches({"SPECSOT_OWN_CAPTURE_TWIN": "cuda"})
    assert set(cpu) == set(stand_ins.CPU_STAND_INS) | set(stand_ins.TEST_MODE)
    assert set(cuda) == set(stand_ins.TEST_MODE)  # no recorded graphs, no CPU gates: real CUDA graphs
    assert stand_ins.patches({}) == {}
    counted = stand_ins.patches({"SPECSOT_SYNC_LOG": "/tmp/x", "SPECSOT_OWN_CAPTURE_TWIN": "1"})
    assert [p.__name__ for p in counted["sglang_specsot.speculative.worker"]] == ["_worker", "_sync_count"]


def test_the_twins_engines_on_a_gpu_take_sglangs_cuda_path():
    env = twin.twin_env("cuda", small=False, environ={"PATH": "/bin"})
    assert env[twin.DEVICE_ENV] == "cuda" and env["SGLANG_SPECSOT_FIXED_WINDOW"] == "1"
    assert not {"SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET", twin.PLAN_ENV} & set(env)
    cpu = twin.twin_env("cpu", small=True, environ={})
    assert cpu["SGLANG_USE_CPU_ENGINE"] == cpu["TRITON_INTERPRET"] == "1" and cpu[twin.PLAN_ENV] == "small"
    spec = twin.engine_kwargs("specsot", "cuda", twin.Plan())
    assert spec["device"] == "cuda" and spec["attention_backend"] == "triton" and "disable_cuda_graph" not in spec
    assert spec["speculative_num_draft_tokens"] == 8 and spec["cuda_graph_max_bs_decode"] == 4
    assert twin.engine_kwargs("plain", "cpu", twin.Plan())["disable_cuda_graph"] is True
    assert twin.SMALL_PLAN.window >= 4  # a tier wide enough for a branch


def test_the_twin_verdict_takes_the_devices_tolerance():
    plain = {"output_ids": [[1, 2]]}
    run = {"output_ids": [[1, 2]], "verify_graphs": {"graphs": True}}
    replays = [{"width": 4, "branching": True, "max_abs_diff": 1e-3}]
    assert "differ from the eager path's" in twin.verdict(plain, run, replays, (1, 2, 4))
    assert twin.verdict(plain, run, replays, (1, 2, 4), tol=twin.CUDA_LOGITS_TOLERANCE) is None


def test_the_tree_stage_runs_the_twin_on_the_gpu_and_says_why_it_failed():
    assert cuda_path.twin_command(False)[-2:] == ["--device", "cuda"]
    assert cuda_path.twin_command(True)[-3:] == ["--device", "cpu", "--small"]
    assert cuda_path.twin_problem({"status": "ok"}, 0, "") is None
    assert cuda_path.twin_problem({"status": "failed", "problem": "logits differ"}, 1, "") == "logits differ"
    said = cuda_path.twin_problem(None, 1, "Traceback\nboom")
    assert said.startswith("the twin printed no result (rc 1)") and said.endswith("boom")


# --- the vocabulary pair -------------------------------------------------------------------------


def test_the_vocab_stage_pairs_the_7b_and_05b_vocabularies():
    assert (cuda_path.DEVICE_VOCAB.target_vocab, cuda_path.DEVICE_VOCAB.draft_vocab) == (152064, 151936)
    smoke = cuda_path.SMOKE_VOCAB
    assert smoke.draft_vocab < smoke.target_vocab
    plan = cuda_path.vocab_parity_plan(cuda_path.DEVICE_VOCAB)
    prompts = cuda_path.parity_stage.parity_prompts(plan)
    assert len(prompts) == plan.prompts and all(2 <= t < cuda_path.PROMPT_IDS for p in prompts for t in p)
    assert cuda_path.accept_problem([2.0, 1.8], 1.5) is None
    assert "1.20 is not above 1.5" in cuda_path.accept_problem([1.2, None], 1.5)
    assert cuda_path.accept_problem([None], 1.5) == "no accept length was reported"


# --- the sync counter ----------------------------------------------------------------------------


def test_a_sync_is_placed_at_the_innermost_frame_outside_torch():
    ours = ("/x/sglang_specsot/speculative/host_sync.py", 40, "settle")
    sglang = ("/x/site-packages/sglang/srt/speculative/eagle_utils.py", 9, "sample")
    torch_frame = ("/x/site-packages/torch/_tensor.py", 3, "tolist")
    relay = ("/usr/lib/python3.12/warnings.py", 1, "_showwarnmsg")
    assert gpu_sync_count.origin([ours, torch_frame, relay]) == {
        "kind": "ours", "at": "sglang_specsot/speculative/host_sync.py:40 settle",
        "ours_at": "sglang_specsot/speculative/host_sync.py:40 settle",
    }  # fmt: skip
    placed = gpu_sync_count.origin([ours, sglang, torch_frame])
    assert placed["kind"] == "sglang" and placed["at"].startswith("sglang/srt/speculative/eagle_utils.py:9")
    assert placed["ours_at"].startswith("sglang_specsot/")
    assert gpu_sync_count.origin([("/app/main.py", 1, "f")])["kind"] == "other"


def _step(step, ours, decode=True, counted=True):
    return {"step": step, "decode": decode, "counted": counted, "ours": ours, "syncs": ours, "drafter": "D",
            "where": [{"kind": "ours", "at": f"a.py:{step}", "ours_at": None}] * ours}  # fmt: skip


def test_the_sync_verdict_allows_one_of_ours_a_decode_step():
    assert gpu_sync_count.verdict([_step(0, 5, decode=False), _step(1, 1), _step(2, 0)]) is None
    said = gpu_sync_count.verdict([_step(1, 1), _step(2, 3)])
    assert said.startswith("1 of 2 decode steps") and "step 2" in said
    assert gpu_sync_count.verdict([_step(1, 3, counted=False)]) is None  # no CUDA: not counted
    assert "no decode step" in gpu_sync_count.verdict([_step(0, 0, decode=False)])
    assert gpu_sync_count.summary([_step(1, 1), _step(2, 0)])["ours_by_step"] == [1, 0]


def test_the_counter_logs_each_step_with_the_warnings_torch_raises_in_it(tmp_path):
    log = tmp_path / "syncs.jsonl"

    class SpecSoTWorker:
        drafter = None

        def forward_batch_generation(self, batch):
            for _ in range(batch.n):
                warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)  # not a sync: passed on

    module = SimpleNamespace(SpecSoTWorker=SpecSoTWorker)
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        gpu_sync_count.install(module, str(log))
        for n, decode in ((0, False), (2, True), (1, True)):
            batch = SimpleNamespace(n=n, reqs=[0, 1], forward_mode=SimpleNamespace(is_decode=lambda d=decode: d))
            module.SpecSoTWorker().forward_batch_generation(batch)
        warnings.warn("called a synchronizing CUDA operation outside a step", UserWarning, stacklevel=1)
    steps = gpu_sync_count.read_steps(log)
    assert [(s["step"], s["decode"], s["syncs"], s["bs"]) for s in steps] == [(0, False, 0, 2), (1, True, 2, 2), (2, True, 1, 2)]
    assert all(w["kind"] == "other" and "test_gpu_check_cuda_path.py" in w["at"] for w in steps[1]["where"])
    assert shown.count("something else") == 3 and len(shown) == 4  # the step-less sync is shown, not counted


def test_the_smoke_records_the_syncs_stage_through_the_recorder(tmp_path):
    out = tmp_path / "gpu_check.jsonl"
    with warnings.catch_warnings():
        gpu_stage_syncs.record_syncs_smoke(out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["stage"] == "syncs" for r in records)
    steps = [r for r in records if r.get("kind") == "sync_step"]
    assert [(s["decode"], s["syncs"]) for s in steps] == [(False, 0), (True, 1), (True, 1)]
    assert records[-1]["status"] == "ok" and records[-1]["engines"] == ["stand-in worker"]


@pytest.mark.parametrize("value", ["1", "cuda"])
def test_sitecustomize_installs_for_the_twin_and_the_counter(value, tmp_path):
    code = "import sys; print([type(f).__name__ for f in sys.meta_path][0])"
    env = {"PYTHONPATH": f"{SCRIPTS / 'own_capture_site'}:{SCRIPTS}", "PATH": "/usr/bin:/bin"}
    for extra in ({"SPECSOT_OWN_CAPTURE_TWIN": value}, {"SPECSOT_SYNC_LOG": str(tmp_path / "s.jsonl")}, {}):
        out = subprocess.run([sys.executable, "-c", code], env=env | extra, capture_output=True, text=True, timeout=60)
        first = out.stdout.strip()
        assert (first == "_PatchAfterImport") == bool(extra), (extra, first, out.stderr)
