"""What connects the packages below the plugin, so that none imports one above it.

- The host changes implemented outside the SGLang boundary get their code here. The ledger
  (host/changes.py) says what each change does to SGLang and why; where the code it installs
  lives in another package (costs/, cpu/, serving/, speculative/; the last three import the
  boundary), the entry names no function (its `hook` is None) and the factory is supplied
  from here.
- The SPECSOT workers get the CPU's part of their work (speculative/device.py): the draft
  model's int8 weights and the OpenMP report, from cpu/, which speculative/ does not import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sglang_specsot.cpu.threads import keep_workers_spinning, spin_report, threads_bind_around
from sglang_specsot.host import changes
from sglang_specsot.speculative import device

logger = logging.getLogger(__name__)


def _draft_backend_factory() -> Callable:
    from sglang_specsot.cpu.draft_attention import draft_backend_factory_around

    return draft_backend_factory_around


def _packed_linear() -> Callable:
    from sglang_specsot.cpu.packed_linear import pack_after_loading

    return pack_after_loading


def _sampling_op(name: str) -> Callable[[], Callable]:
    def hook() -> Callable:
        from sglang_specsot.cpu import sampling

        return getattr(sampling, name)

    return hook


def _chat_route() -> Callable:
    # Refuses (SystemExit) a bad SGLANG_SPECSOT_SOT_MODE, so the server fails at start-up.
    from sglang_specsot.serving.chat import sot_chat_hook

    return sot_chat_hook()


def _request_checks() -> Callable:
    from sglang_specsot.serving.request_checks import validate_one_request_after

    return validate_one_request_after


def _server_info() -> Callable:
    from sglang_specsot.speculative.server_info import add_speculative_after

    return add_speculative_after


def _dummy_verify_input() -> Callable:
    from sglang_specsot.speculative.verify_input import dummy_verify_input_around

    return dummy_verify_input_around


def _bigram_radix_keys() -> Callable:
    from sglang_specsot.speculative.radix_keys import create_tree_cache_around

    return create_tree_cache_around


def _chat_body() -> Callable:
    from sglang_specsot.serving.chat_body import chat_body_around

    return chat_body_around


def _row_cost_probe() -> Callable:
    from sglang_specsot.costs.probe import probe_after_start_up

    return probe_after_start_up


def _row_costs_report() -> Callable:
    from sglang_specsot.costs.published import add_row_costs_after

    return add_row_costs_after


# Host change name -> the factory of what it installs (lazy: it may import torch or SGLang).
HOST_CHANGE_HOOKS: dict[str, Callable[[], Callable]] = {
    "omp-spin-on-cpu": lambda: keep_workers_spinning,
    "cpu-threads-bind-without-amx": lambda: threads_bind_around,
    "cpu-packed-linear-weights": _packed_linear,
    "draft-backend-factory-specsot-cpu": _draft_backend_factory,
    "cpu-tree-speculative-sampling-target-only": _sampling_op("tree_speculative_sampling_target_only"),
    "cpu-top-k-renorm-prob": _sampling_op("top_k_renorm_prob"),
    "cpu-top-p-renorm-prob": _sampling_op("top_p_renorm_prob"),
    "sot-chat-route": _chat_route,
    "chat-body-is-an-object": _chat_body,
    "reject-unservable-requests": _request_checks,
    "server-info-specsot": _server_info,
    "specsot-dummy-verify-input": _dummy_verify_input,
    "draft-model-bigram-radix-keys": _bigram_radix_keys,
    "row-cost-probe": _row_cost_probe,
    "server-info-row-costs": _row_costs_report,
}


def apply_host_changes() -> list[str]:
    """Apply every host change this process takes (host/changes.py), with the hooks above."""
    return changes.apply_host_changes(HOST_CHANGE_HOOKS)


def _int8_draft_on_cpu(model, shared: set[int], on: str):
    """On CPU, give the draft model int8 weights where measured faster (cpu/draft_int8.py);
    never a weight it shares with the target (`shared`), whose products decide what is
    accepted. The summary of what was quantized, or None."""
    import torch

    from sglang_specsot.cpu.draft_int8 import DRAFT_INT8_ENV, FORCED_KERNEL, draft_int8_mode, quantize_draft

    mode = draft_int8_mode()
    if torch.device(on).type != "cpu" or mode == "off":
        return None
    summary = quantize_draft(model, exclude=shared, measured=mode == "auto", forced=FORCED_KERNEL.get(mode, "int8"))
    logger.info("SPECSOT draft model weights in int8 where faster (%s=off keeps them): %s",
                DRAFT_INT8_ENV, summary.info())  # fmt: skip
    return summary


DEVICE_SUPPORT = device.DeviceSupport(prepare_draft_model=_int8_draft_on_cpu, thread_report=spin_report)


def register_specsot() -> None:
    """Register SPECSOT (speculative/registration.py), its workers given DEVICE_SUPPORT."""
    from sglang_specsot.speculative.registration import register_specsot as register

    device.provide(DEVICE_SUPPORT)
    register()
