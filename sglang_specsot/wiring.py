"""What connects the packages below the plugin: the host changes implemented outside the
SGLang boundary get their code here.

The ledger (host/changes.py) says what each change does to SGLang and why. Where the code
it installs lives in cpu/, serving/ or speculative/, which all import the boundary, the
entry names no function (its `hook` is None) and the factory is supplied from here, so the
boundary imports none of them and no package imports one above it.
"""

from __future__ import annotations

from collections.abc import Callable

from sglang_specsot.host import changes


def _draft_backend_factory() -> Callable:
    from sglang_specsot.cpu.draft_attention import draft_backend_factory_around

    return draft_backend_factory_around


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


# Host change name -> the factory of what it installs (lazy: it may import torch or SGLang).
HOST_CHANGE_HOOKS: dict[str, Callable[[], Callable]] = {
    "draft-backend-factory-specsot-cpu": _draft_backend_factory,
    "cpu-tree-speculative-sampling-target-only": _sampling_op("tree_speculative_sampling_target_only"),
    "cpu-top-k-renorm-prob": _sampling_op("top_k_renorm_prob"),
    "cpu-top-p-renorm-prob": _sampling_op("top_p_renorm_prob"),
    "sot-chat-route": _chat_route,
    "reject-unservable-requests": _request_checks,
    "server-info-specsot": _server_info,
}


def apply_host_changes() -> list[str]:
    """Apply every host change this process takes (host/changes.py), with the hooks above."""
    return changes.apply_host_changes(HOST_CHANGE_HOOKS)
