"""GPUs on a CPU: a stand-in for torch's device placement, so hand-off bugs show up in CI.

Inside `SimulatedDevices()`, `cuda:0` and `cuda:1` exist: a tensor moved there is a CPU tensor
whose storage is tagged with that device, and every torch call checks its tensor arguments the
way CUDA does, raising torch's own complaint ("Expected all tensors to be on the same device")
where a real GPU would. What the real rules allow is allowed here too: a 0-dim CPU tensor
mixes with any device (a scalar), indices may live on the CPU, `to`/`copy_` cross devices,
`.numpy()` needs the CPU. The device is a property of the storage (views share it), as in torch.

It runs diffusers' and transformers' real code unchanged: only where tensors are is simulated,
the arithmetic is the CPU's.
"""

from __future__ import annotations

import weakref

import torch
from torch.overrides import TorchFunctionMode

CPU = "cpu"
_GETTERS = {torch.Tensor.device.__get__, torch.Tensor.is_cuda.__get__}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_, torch.Tensor.index_put}


class DeviceMismatch(RuntimeError):
    pass


def _walk(value, out: list) -> list:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _walk(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _walk(v, out)
    return out


def _fake(device) -> str | None:
    """'cuda:N' for a simulated device, None for the CPU (or no device)."""
    if device is None:
        return None
    if isinstance(device, int):
        return f"cuda:{device}"
    d = torch.device(device)
    if d.type == "cpu":
        return None
    if d.type != "cuda":
        raise ValueError(f"only cpu and cuda are simulated, not {d}")
    return f"cuda:{d.index or 0}"


class _Owners:
    """The live tensors tagged at one storage address, by identity (a WeakSet would compare tensors with ==)."""

    def __init__(self, t: torch.Tensor) -> None:
        self._refs: dict[int, weakref.ref] = {}
        self.add(t)

    def add(self, t: torch.Tensor) -> None:
        self._refs[id(t)] = weakref.ref(t)

    def __contains__(self, t: torch.Tensor) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t

    def __len__(self) -> int:
        self._refs = {k: r for k, r in self._refs.items() if r() is not None}
        return len(self._refs)


class SimulatedDevices(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        # storage address -> (simulated device, the tensors tagged there). An address is reused once its
        # storage is freed, by tensors this mode may never see made (torch.from_numpy, C++ internals): a tag
        # whose tensors are all gone is stale, and the storage now there is on the CPU.
        self._where: dict[int, tuple[str, _Owners]] = {}
        self.checked = 0  # torch calls whose devices were checked

    # -- the map --------------------------------------------------------------------------------

    def device_of(self, t: torch.Tensor) -> str:
        ptr = t.untyped_storage().data_ptr()
        entry = self._where.get(ptr) if ptr else None
        if entry is None:
            return CPU
        device, owners = entry
        if t not in owners:
            if not len(owners):  # stale: every tensor tagged at this address is gone
                del self._where[ptr]
                return CPU
            owners.add(t)  # another view of a live tagged storage (e.g. `.data`)
        return device

    def _tag(self, value, device: str) -> None:
        for t in _walk(value, []):
            ptr = t.untyped_storage().data_ptr()
            if not ptr:
                continue
            if device == CPU:
                self._where.pop(ptr, None)
                continue
            entry = self._where.get(ptr)
            if entry is not None and entry[0] == device and len(entry[1]):
                entry[1].add(t)
            else:
                self._where[ptr] = (device, _Owners(t))

    def place(self, module: torch.nn.Module, device) -> None:
        """Put a loaded module 'on' a simulated device (its parameters and buffers)."""
        target = _fake(device) or CPU
        for t in [*module.parameters(), *module.buffers()]:
            self._tag(t, target)

    # -- the rules ------------------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _GETTERS:
            where = self.device_of(args[0])
            if func is torch.Tensor.is_cuda.__get__:
                return where != CPU
            return torch.device(where)
        name = getattr(func, "__name__", str(func))
        if func is torch.Tensor.numpy and self.device_of(args[0]) != CPU:
            raise TypeError(f"can't convert {self.device_of(args[0])} device type tensor to numpy. Use Tensor.cpu() (simulated)")
        if func is torch.Tensor.to:
            return self._to(args, kwargs)
        if func is torch.Tensor.cpu:
            return self._move(args[0], CPU)
        if func is torch.Tensor.cuda:
            return self._move(args[0], _fake(args[1] if len(args) > 1 else kwargs.get("device", 0)))
        if func is torch.Tensor.__deepcopy__:  # a copy where the original is (the memo holds unrelated tensors)
            out = func(*args, **kwargs)
            self._tag(out, self.device_of(args[0]))
            return out
        if func is torch.Tensor.copy_:  # crosses devices; the destination keeps its own
            dst = args[0]
            where = self.device_of(dst)
            out = func(*args, **kwargs)
            self._tag(out, where)
            return out
        # A factory call (device=...) makes its result there; compute on the CPU.
        target = None
        if "device" in kwargs:
            target = _fake(kwargs["device"]) or CPU
            kwargs["device"] = CPU
        if target is None:
            target = self._check(func, name, args, kwargs)
        self.checked += 1
        out = func(*args, **kwargs)
        self._tag(out, target)
        return out

    def _check(self, func, name: str, args, kwargs) -> str:
        if func in _INDEXING:
            return self._check_indexing(func, name, args, kwargs)
        return self._common(name, _walk(args, []) + _walk(kwargs, []))

    def _common(self, name: str, tensors: list) -> str:
        """The one device `tensors` share (a CPU scalar goes with any device), or torch's complaint."""
        found = []
        for t in tensors:
            where = self.device_of(t)
            if where == CPU and t.dim() == 0:
                continue
            if where not in found:
                found.append(where)
        if len(found) > 1:
            raise DeviceMismatch(
                f"Expected all tensors to be on the same device, but found at least two devices, {found[0]} and "
                f"{found[1]}! (simulated, in {name})"
            )
        return found[0] if found else CPU

    def _check_indexing(self, func, name: str, args, kwargs) -> str:
        """Reading `x[i]` takes indices on the CPU or on x's device; writing moves the indices to x's device,
        but the values written must be on x's device (torch's index and index_put)."""
        base = self.device_of(args[0])
        indices = _walk(args[1] if len(args) > 1 else kwargs.get("indices", ()), [])
        if func is torch.Tensor.__getitem__:
            for t in indices:
                if self.device_of(t) not in (CPU, base):
                    raise DeviceMismatch(
                        f"indices should be either on cpu or on the same device as the indexed tensor ({base}) (simulated)"
                    )
            return base
        values = _walk(args[2] if len(args) > 2 else kwargs.get("values", ()), [])
        return self._common(name, [args[0], *values])

    def _move(self, t: torch.Tensor, target: str | None) -> torch.Tensor:
        target = target or CPU
        if self.device_of(t) == target:
            return t
        out = t.clone()
        self._tag(out, target)
        return out

    def _to(self, args, kwargs):
        self_, rest = args[0], args[1:]
        other = next((a for a in rest if isinstance(a, torch.Tensor)), kwargs.get("other"))
        if other is not None:
            target = self.device_of(other)
            dtype = other.dtype
            out = self_.to(dtype=dtype)
        else:
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kwargs)
            target = (_fake(device) or CPU) if device is not None else self.device_of(self_)
            out = self_.to(dtype=dtype) if dtype is not None else self_
        if out is self_:
            return self._move(self_, target)
        self._tag(out, target)
        return out


# The components of each placeable part of an h3core model (pipeline/model.py: the VAEs go together).
PARTS = {"transformer": ("transformer", "transformer_ref"), "text_encoder": ("text_encoder",), "vae": ("vae", "audio_vae")}


def place_model(model, placement: dict[str, str]) -> SimulatedDevices:
    """Put a loaded model's parts (`pipeline.model.LoadedModel`, loaded on the CPU) on simulated devices,
    {"transformer": "cuda:0", "text_encoder": "cpu", "vae": "cuda:1"}; returns the simulator to run its jobs in."""
    sim = SimulatedDevices()
    model.device = torch.device(placement["transformer"])
    model.placement = {p: torch.device(d) for p, d in placement.items() if p != "transformer"}
    for part, names in PARTS.items():
        for name in names:
            if model.has(name):
                sim.place(model.components[name], placement[part])
    return sim
