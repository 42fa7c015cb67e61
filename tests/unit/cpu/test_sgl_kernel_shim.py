"""The `sgl_kernel` shim as SGLang meets it, in fresh interpreters.

The import hook (`sglang_specsot._bootstrap`, installed by a .pth file) acts at interpreter
start-up and at the first `import sgl_kernel`, so these run in subprocesses with the
environment under test: the hook's own cases each in its own, SGLang's through the shim in
the CPU-engine interpreter the unit tests share, before the plugin registers (`cpu_process`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.unit import cpu_checks

SGLANG_IMPORT_TIMEOUT_S = 300


def _run(code: str, tmp_path, cpu_engine: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SGLANG_SPECSOT_CPU_KERNELS", None)  # the default ("auto") path is under test
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    if cpu_engine is not None:
        env["SGLANG_USE_CPU_ENGINE"] = cpu_engine
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,  # proves nothing depends on running from the repository
        env=env,
        capture_output=True,
        text=True,
        timeout=SGLANG_IMPORT_TIMEOUT_S,
    )


def _assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), (
        f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n"
        f"stderr:\n{result.stderr[-6000:]}"
    )


def test_hook_serves_the_shim_without_importing_sglang(tmp_path):
    code = """
        import sys
        import torch
        import sgl_kernel
        import sgl_kernel.speculative
        from sglang_specsot.cpu import kernels

        assert sgl_kernel.IS_SGLANG_SPECSOT_SHIM is True
        assert sgl_kernel.__name__ == "sgl_kernel"
        for name in sgl_kernel.__all__:
            if name.endswith("_cpu"):
                assert getattr(sgl_kernel, name) is getattr(kernels, name), name
        assert (
            sgl_kernel.speculative.reconstruct_indices_from_tree_mask
            is kernels.reconstruct_indices_from_tree_mask
        )
        # SGLang imports sgl_kernel while importing itself: the shim must not import SGLang.
        loaded = [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]
        assert not loaded, loaded
        # SGLang detects a real AMX build through torch.ops.sgl_kernel (utils/common.py:352).
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
        print("OK")
    """
    _assert_ok(_run(code, tmp_path, cpu_engine="1"))


@pytest.mark.parametrize("cpu_engine", [None, "0"])
def test_hook_stays_out_of_the_way_without_cpu_engine(tmp_path, cpu_engine):
    code = """
        import sys
        from sglang_specsot._bootstrap import SglKernelCpuFinder

        # The hook is installed in every interpreter; it must decline, not be absent.
        assert any(isinstance(f, SglKernelCpuFinder) for f in sys.meta_path)
        try:
            import sgl_kernel
        except ModuleNotFoundError as exc:
            assert exc.name == "sgl_kernel", exc.name
            print("OK")
        else:
            raise AssertionError(f"import sgl_kernel succeeded: {sgl_kernel.__file__}")
    """
    _assert_ok(_run(code, tmp_path, cpu_engine=cpu_engine))


# Every module that imports from sgl_kernel on the dense Llama/Qwen2 CPU path and the
# NGRAM / STANDALONE / EAGLE / EAGLE3 paths, and the names each one binds.
SHIM_BINDINGS = cpu_checks.add("shim-bindings", textwrap.dedent("""
        import importlib
        from sglang_specsot.cpu import kernels

        bindings = {
            "sglang.srt.mem_cache.allocation": ["assign_req_to_token_pool_cpu"],
            "sglang.kernels.ops.kvcache.cache_move": ["copy_all_layer_kv_cache_cpu"],
            "sglang.kernels.ops.speculative.cache_locs": [
                "assign_draft_cache_locs_contiguous_cpu",
                "assign_extend_cache_locs_cpu",
            ],
            "sglang.kernels.ops.speculative.eagle": [
                "fill_accept_out_cache_loc_cpu",
                "fill_bonus_tokens_cpu",
            ],
            "sglang.kernels.ops.speculative.spec_tree": [
                ("sgl_build_tree_kernel_efficient_cpu", "build_tree_kernel_efficient_cpu"),
                ("sgl_verify_tree_greedy_cpu", "verify_tree_greedy_cpu"),
            ],
            "sglang.kernels.ops.speculative.reconstruct_tree": [
                "reconstruct_indices_from_tree_mask"
            ],
            "sglang.kernels.ops.speculative.multi_layer_eagle": ["rotate_input_ids_cpu"],
        }
        for module_name, names in bindings.items():
            module = importlib.import_module(module_name)
            for name in names:
                bound, ours = name if isinstance(name, tuple) else (name, name)
                assert getattr(module, bound) is getattr(kernels, ours), (module_name, bound)
        for module_name in [
            "sglang.srt.mem_cache.memory_pool",
            "sglang.srt.speculative.eagle_utils",
            "sglang.srt.speculative.eagle_worker_v2",
            "sglang.srt.speculative.standalone_worker_v2",
            "sglang.srt.speculative.ngram_worker",
            "sglang.srt.models.llama",
            "sglang.srt.models.qwen2",
        ]:
            importlib.import_module(module_name)
"""), before_plugin=True)  # fmt: skip


def test_sglang_cpu_modules_bind_the_shim_ops(cpu_process):
    cpu_process(SHIM_BINDINGS)


# SGLang's own wrappers, called as its workers call them: positional/keyword signatures
# (verify passes `retrive_*` keywords, fill_accept passes 3 arguments on CPU) and results.
SHIM_CALL_SITES = cpu_checks.add("shim-call-sites", textwrap.dedent("""
        import torch

        from sglang.srt.mem_cache import allocation
        rtt = torch.zeros(3, 16, dtype=torch.int32)
        allocation.assign_req_to_token_pool_func(
            torch.tensor([2, 0]), rtt, torch.tensor([1, 3], dtype=torch.int32),
            torch.tensor([3, 4], dtype=torch.int32), torch.tensor([7, 8, 9]), 2,
        )
        assert rtt[2, 1:3].tolist() == [7, 8] and rtt[0, 3].item() == 9
        assert int(rtt.count_nonzero()) == 3

        from sglang.kernels.ops.speculative import cache_locs
        rtt = torch.arange(48, dtype=torch.int32).view(3, 16)
        rpi, starts = torch.tensor([1, 2]), torch.tensor([2, 5])
        out = cache_locs.assign_extend_cache_locs_func(
            req_pool_indices=rpi, req_to_token=rtt, start_offset=starts,
            end_offset=starts + 2, batch_size=2, draft_token_num=2, device="cpu",
        )
        assert out.tolist() == [18, 19, 37, 38], out
        out = cache_locs.assign_extend_cache_locs_uniform_func(rpi, rtt, starts, 2, 2, "cpu")
        assert out.tolist() == [18, 19, 37, 38], out
        front = torch.zeros(4, dtype=torch.int64)
        window = torch.tensor([10, 11, 20, 21])
        cache_locs.fill_front_out_cache_loc_func(torch.tensor([1, 2]), window, front)
        assert front.tolist() == [10, 20, 21, 0], front
        out = torch.empty(8, dtype=torch.int64)
        seq_lens = torch.tensor([3, 6])
        cache_locs.assign_draft_cache_locs_contiguous_func(rpi, rtt, seq_lens, out, 2, 2)
        assert out.tolist() == [19, 20, 21, 22, 38, 39, 40, 41], out

        from sglang.kernels.ops.speculative import eagle
        bonus = torch.empty(2, dtype=torch.int32)
        accept_tokens = torch.tensor([[5, 6, 7], [8, 9, 10]], dtype=torch.int32)
        accept_lens = torch.tensor([2, 3], dtype=torch.int32)
        eagle.fill_bonus_tokens_func(accept_tokens, accept_lens, bonus, 3, 2)
        assert bonus.tolist() == [6, 10], bonus
        accepted = torch.zeros(6, dtype=torch.int64)
        accept_index = torch.tensor([[0, 2, -1], [3, -1, -1]], dtype=torch.int32)
        out_cache_loc = torch.tensor([100, 101, 102, 103])
        eagle.fill_accept_out_cache_loc_func(accept_index, out_cache_loc, accepted, 6)
        assert accepted.tolist() == [100, 102, 103, 0, 0, 0], accepted

        # topk 2, 2 steps, 4 verify tokens: scores 0, 1 hang off the root, score 2 off score 0.
        from sglang.srt.speculative import eagle_utils
        from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, verify_tree_greedy_func
        assert eagle_utils.default_tree_mask_mode() == TreeMaskMode.QLEN_ONLY
        built = eagle_utils.build_tree_kernel_efficient(
            bonus_tokens=torch.tensor([50]), parent_list=torch.tensor([[-1, 0, 1]]),
            top_scores_index=torch.tensor([[0, 1, 2]]), draft_tokens=torch.tensor([[61, 62, 63]]),
            seq_lens=torch.tensor([5]), seq_lens_sum=5, topk=2, spec_steps=2, num_verify_tokens=4,
            tree_mask_mode=TreeMaskMode.QLEN_ONLY,
        )
        tree_mask, positions, ridx, rnt, rns, draft_tokens = built
        assert positions.tolist() == [5, 6, 6, 7], positions
        assert rnt.tolist() == [[1, 3, -1, -1]] and rns.tolist() == [[-1, 2, -1, -1]], (rnt, rns)
        rows = tree_mask.view(4, 4).int().tolist()
        assert rows == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], rows
        full_mask = eagle_utils.build_tree_kernel_efficient(
            torch.tensor([50]), torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]),
            torch.tensor([[61, 62, 63]]), torch.tensor([2]), 2, 2, 2, 4, TreeMaskMode.FULL_MASK,
        )[0]
        full_rows = full_mask.view(4, 6)  # 2 prefix columns, then the tree
        assert full_rows[:, 2:].int().tolist() == rows and bool(full_rows[:, :2].all())

        predict = torch.zeros(4, dtype=torch.int32)
        accept_index = torch.full((1, 3), -1, dtype=torch.int32)
        num_correct = torch.empty(1, dtype=torch.int32)
        target = torch.tensor([[62, 70, 71, 72]])  # matches node 2, the root's second child
        predict, accept_index, num_correct = verify_tree_greedy_func(
            predicts=predict, accept_index=accept_index, accept_token_num=num_correct,
            candidates=draft_tokens.view(1, 4), retrieve_index=ridx, retrieve_next_token=rnt,
            retrieve_next_sibling=rns, target_predict=target, topk=2,
        )
        assert accept_index.tolist() == [[0, 2, -1]] and num_correct.tolist() == [1]
        assert predict.tolist() == [62, 0, 71, 0], predict

        from sglang.kernels.ops.speculative import reconstruct_tree
        ngram_mask = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0, 1], dtype=torch.bool)  # 0 -> {1, 2}
        positions = torch.empty(3, dtype=torch.long)
        links = torch.empty((3, 1, 3), dtype=torch.long)
        reconstruct_tree.reconstruct_indices_from_tree_mask_func(
            ngram_mask, torch.tensor([9]), positions, *links, 1, 3
        )
        assert positions.tolist() == [9, 10, 10]
        assert links.tolist() == [[[0, 1, 2]], [[1, -1, -1]], [[-1, 2, -1]]], links

        from sglang.kernels.ops.speculative.multi_layer_eagle import rotate_input_ids
        ids = torch.tensor([1, 2, 3, 4, 5])
        rotate_input_ids(ids, torch.tensor([0, 3]), torch.tensor([3, 2]), torch.tensor([9, 8]))
        assert ids.tolist() == [2, 3, 9, 5, 8], ids

        # The KV pool copies slots through raw data pointers: once at set-up, then per move.
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        pool = MHATokenToKVPool(
            size=64, page_size=1, dtype=torch.float16, head_num=2, head_dim=8, layer_num=3,
            device="cpu", enable_memory_saver=False, enable_kv_cache_copy=True,
        )
        buffers = pool.k_buffer + pool.v_buffer
        for i, buf in enumerate(buffers):
            buf.copy_(torch.arange(buf.numel(), dtype=torch.float32).view(buf.shape) + 1000 * i)
        before = [buf.clone() for buf in buffers]
        tgt, src = torch.tensor([3, 4, 5]), torch.tensor([10, 3, 20])
        pool.move_kv_cache(tgt, src)
        for buf, old in zip(buffers, before):
            expected = old.clone()
            expected[tgt] = old[src]
            assert torch.equal(buf, expected)
"""), before_plugin=True)  # fmt: skip


def test_sglang_call_sites_reach_the_shim(cpu_process):
    cpu_process(SHIM_CALL_SITES)
