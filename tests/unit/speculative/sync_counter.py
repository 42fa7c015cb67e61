"""Counting the reads a decode step would make the host wait for on a GPU, on a CPU run.

On a CPU every tensor is on the host, so nothing blocks; what a CUDA run would wait for is a
read of a tensor the device produced. `SyncCounter` (a torch function mode) keeps which tensors
are "on the device": those the test marks (the batch's), and every tensor a torch op makes
from one of them or with an explicit `device=` (a non-blocking copy to the device included).
It counts, from our package's frames:

- `.tolist()`, `.item()`, `.cpu()`, `.numpy()`, `bool()` / `int()` / `float()` of a device
  tensor, and `.to("cpu")` without `non_blocking`: a synchronous copy from device memory
  (what `torch.cuda.set_sync_debug_mode` flags);
- the same reads of a host buffer a non-blocking copy from the device is filling
  (`copy_(..., non_blocking=True)`), unless a counted wait came after the copy was queued:
  that wait drained the stream, the copy with it;
- `.to(device)` of a host tensor without `non_blocking` (a pageable copy, which blocks);
- `torch.cuda.synchronize()` (patched by the test where it runs on a CPU).
"""

from __future__ import annotations

import itertools
import sys
import weakref
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

_READS = {"tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}
_OURS = "sglang_specsot"
# Our CPU versions of SGLang's CUDA kernels (cpu/kernels.py): on a GPU SGLang's kernels run,
# on the device, so what these read on a CPU is no wait there.
_STAND_INS = "sglang_specsot.cpu."


@dataclass
class SyncCounter(TorchFunctionMode):
    """Counts the blocking reads our code makes of device tensors while the mode is on."""

    ours: str = _OURS  # the modules whose waits count (by name prefix)
    syncs: list[str] = field(default_factory=list)  # "where: what" of each counted wait
    _device: dict = field(default_factory=dict)  # id(tensor) -> (when made, weakref)
    _filling: dict = field(default_factory=dict)  # id(host buffer) -> (when its copy was queued, weakref)
    _clock: itertools.count = field(default_factory=itertools.count)
    _last_wait: int = -1

    def __post_init__(self):
        super().__init__()

    def device(self, *tensors: torch.Tensor) -> None:
        """Mark `tensors` as on the device, made now."""
        for t in tensors:
            self._mark(t, next(self._clock))

    def synchronize(self) -> None:
        """torch.cuda.synchronize's stand-in: a wait for everything queued."""
        self._wait(_caller(2), "torch.cuda.synchronize")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        now = next(self._clock)
        tensors = [t for t in _flat(args, kwargs) if isinstance(t, torch.Tensor)]
        from_device = [t for t in tensors if id(t) in self._device]
        where = _caller(2)
        self._count(name, args, kwargs, from_device, where)
        out = func(*args, **kwargs)
        if name == "copy_" and kwargs.get("non_blocking") and id(args[0]) not in self._device and from_device:
            self._mark(args[0], now, self._filling)  # a host buffer the device fills later
            return out
        if _is_host_read(name, args, kwargs) and isinstance(out, torch.Tensor):
            # The copy on the host (on a CPU, `.cpu()` returns the tensor itself: it is done).
            self._device.pop(id(out), None)
            return out
        if from_device or _made_on_device(name, kwargs, args):
            for t in _flat((out,), {}):
                if isinstance(t, torch.Tensor):
                    self._mark(t, now)
            if name.endswith("_") or name == "__setitem__" or "out" in kwargs:  # written in place
                for t in [args[0] if args else None, kwargs.get("out")]:
                    if isinstance(t, torch.Tensor):
                        self._mark(t, now)
        return out

    def _count(self, name: str, args, kwargs, from_device: list, where: str) -> None:
        self_arg = args[0] if args else None
        on_device = isinstance(self_arg, torch.Tensor) and id(self_arg) in self._device
        filling = isinstance(self_arg, torch.Tensor) and id(self_arg) in self._filling
        if name in _READS and on_device:
            self._wait(where, name)
        elif name in _READS and filling and self._filling[id(self_arg)][0] > self._last_wait:
            self._wait(where, f"{name} of a copy still on its way")
        elif name == "to" and on_device and _host_target(args, kwargs) and not kwargs.get("non_blocking", False):
            self._wait(where, "to(cpu)")
        elif name == "to" and isinstance(self_arg, torch.Tensor) and not on_device and _device_target(args, kwargs):
            if not kwargs.get("non_blocking", False):
                self._wait(where, "pageable to(device)")

    def _wait(self, where: str, what: str) -> None:
        self._last_wait = next(self._clock)
        if where.startswith(self.ours) and not where.startswith(_STAND_INS):
            self.syncs.append(f"{where}: {what}")

    def _mark(self, t: torch.Tensor, when: int, into: dict | None = None) -> None:
        into = self._device if into is None else into
        key = id(t)
        into[key] = (when, weakref.ref(t, lambda _, key=key: into.pop(key, None)))
        base = t._base
        if base is not None and id(base) not in into:
            self._mark(base, when, into)


def _flat(args, kwargs):
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from _flat(value, {})
        else:
            yield value


def _made_on_device(name: str, kwargs: dict, args) -> bool:
    """A factory given an explicit device (host tensors are made without one), or a copy to one."""
    if kwargs.get("pin_memory"):
        return False
    if "device" in kwargs and kwargs["device"] is not None:
        return True
    return name == "to" and _device_target(args, kwargs)


def _is_host_read(name: str, args, kwargs) -> bool:
    return name in _READS or (name == "to" and _host_target(args, kwargs) and not kwargs.get("non_blocking"))


def _target(args, kwargs):
    if "device" in kwargs:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            return a
    return None


def _host_target(args, kwargs) -> bool:
    """A copy to the host: our code names the host "cpu" (the device it names by a variable)."""
    target = _target(args, kwargs)
    return isinstance(target, str) and target == "cpu"


def _device_target(args, kwargs) -> bool:
    target = _target(args, kwargs)
    return target is not None and not _host_target(args, kwargs)


def _caller(depth: int) -> str:
    """The module and line of the first frame outside torch and this file, `depth` up."""
    frame = sys._getframe(depth)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not (module.startswith("torch") or module == __name__):
            return f"{module}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
