"""What a SPECSOT worker takes from the package of the device it runs on (cpu/ here).

speculative/ imports no device package: the plugin provides these once per process when it
registers SPECSOT (wiring.register_specsot). SGLang builds the worker from the class the
registration's factory returns (scheduler.py:1063-1064), with arguments of its own, so the
worker takes them from here when it is built. The defaults do nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _nothing(*args: object) -> None:
    return None


@dataclass(frozen=True)
class DeviceSupport:
    """The device-specific parts of a SPECSOT worker."""

    # (draft model, data_ptr of every target weight, the worker's device) -> a summary of what
    # it changed in the draft model (shown by its `.info()` in /server_info), or None. On a
    # CPU: int8 weights where measured faster, never a weight the target shares.
    prepare_draft_model: Callable[[Any, set[int], str], Any] = _nothing
    # What /server_info shows of the device's compute threads (a CPU's OpenMP spin), or None.
    thread_report: Callable[[], dict | None] = _nothing


NO_DEVICE_SUPPORT = DeviceSupport()
_provided = NO_DEVICE_SUPPORT


def provide(support: DeviceSupport) -> None:
    """Set what the SPECSOT workers of this process take from their device."""
    global _provided
    _provided = support


def provided() -> DeviceSupport:
    """What `provide` set in this process (nothing, where SPECSOT was registered without it)."""
    return _provided
