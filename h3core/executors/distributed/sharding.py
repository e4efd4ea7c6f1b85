"""Spread one MiniMax-H3 transformer over the ranks of a process group (runs inside a rank).

Two independent ways, on one device mesh of the group's k ranks:

- **FSDP2** (`fully_shard`): each rank keeps about 1/k of the weights and gathers a block's
  parameters just before it runs. The model is built on the meta device and its shards are
  filled from one full state dict that rank 0 reads and broadcasts, so the host never holds k
  full copies. FSDP2 wants one dtype per group, so every module the checkpoint keeps in
  float32 beside the bfloat16 blocks is its own group.
- **Ulysses** (diffusers' context parallelism with the model's `_cp_plan`): each rank carries
  1/k of the packed sequence and all-to-alls to full sequence / 1/k of the heads for attention.
  The packed sequence is whatever the prompt and canvas make, so it is rarely divisible by k:
  `ulysses_anything` is always on.

diffusers 0.42.1 has two rough edges on a CPU, worked around here and nowhere else
(`tests/unit/executors/distributed/test_sharding.py` fails when either workaround stops being
needed or stops working):

1. `_resolve_parallel_config` takes the device index modulo `torch.accelerator.device_count()`,
   which is 0 without an accelerator (ZeroDivisionError). We resolve the config ourselves with
   the rank's real device and the group's mesh.
2. `ulysses_anything` gathers uneven shards with `dist.all_gather`, which gloo refuses ("invalid
   tensor size"). On gloo we pad every shard to the largest, gather, and trim.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from h3core.executors.pipeline.generate import quiet


def init_group(*, rank: int, world: int, rendezvous: str, backend: str, timeout_s: float) -> None:
    """Join the group's process group. `timeout_s` bounds every collective, so no rank waits forever.

    `rendezvous` is a file on the group's node (`file://...`): a group never spans nodes, and torch's
    TCP store would listen on every interface.
    """
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=rendezvous,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def make_mesh(device_type: str, world: int):
    """One 2-D mesh ("ring" = 1, "ulysses" = k); FSDP2 shards over the same ranks (the ulysses dim)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (1, world), mesh_dim_names=("ring", "ulysses"))


def load_transformer(path: Path, *, dtype, device, mesh, fsdp: bool):
    """The transformer at `path`, on `device`; with `fsdp`, sharded over `mesh` and filled from rank 0."""
    from diffusers import MiniMaxH3Transformer3DModel

    if not fsdp:
        return MiniMaxH3Transformer3DModel.from_pretrained(path, local_files_only=True, torch_dtype=dtype).to(device).eval()
    import torch
    import torch.distributed as dist
    from accelerate import init_empty_weights
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    cls = MiniMaxH3Transformer3DModel
    with init_empty_weights(include_buffers=False):  # parameters on meta; computed buffers (rope) stay real
        model = cls.from_config(cls.load_config(path, local_files_only=True))
    keep = tuple(getattr(cls, "_keep_in_fp32_modules", None) or ())
    fp32 = [m for name, m in model.named_children() if any(k in name for k in keep)]
    for m in model.children():  # child by child: a whole-model .to() warns about the fp32 modules
        m.to(torch.float32 if m in fp32 else dtype)
    shard(model, mesh["ulysses"], separate=fp32)
    # to_empty() would discard the computed, non-persistent buffers; keep them across it.
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in buffers:
                b.copy_(buffers[n])
    full = read_state_dict(path) if dist.get_rank() == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    return model.eval()


def shard(model, mesh, *, separate=()) -> None:
    """`fully_shard` every transformer and refiner block, each module in `separate`, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in list(model.transformer_blocks) + list(getattr(model.token_refiner, "refiner_blocks", [])):
        fully_shard(block, mesh=mesh)
    for module in separate:
        if any(True for _ in module.parameters()):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def read_state_dict(path: Path) -> dict[str, Any]:
    """Every tensor of the component folder's safetensors files (one read, on this host)."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path}")
    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(f))
    return out


def enable_ulysses(model, mesh, device) -> None:
    """diffusers' Ulysses context parallelism on `mesh`, with the CPU workarounds above."""
    from diffusers import ContextParallelConfig

    config = ContextParallelConfig(ulysses_degree=mesh.size(), ulysses_anything=True, mesh=mesh)
    with _resolved_on(model, device):
        with quiet("diffusers.models.modeling_utils"):  # "enable_parallelism is experimental", per model
            model.enable_parallelism(config=config)
    if _backend() == "gloo":
        install_gloo_gather()


@contextlib.contextmanager
def _resolved_on(model, device) -> Iterator[None]:
    """Make `enable_parallelism` resolve its config on `device` instead of `rank % device_count()`."""
    import torch.distributed as dist
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    def resolve(config):
        if isinstance(config, ContextParallelConfig):
            config = ParallelConfig(context_parallel_config=config)
        config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=config.context_parallel_config.mesh)
        model._parallel_config = config
        return config

    model._resolve_parallel_config = resolve  # instance attribute: shadows the method for this call only
    try:
        yield
    finally:
        del model._resolve_parallel_config


def install_gloo_gather() -> None:
    """Replace diffusers' uneven all-gather with pad-to-largest, gather, trim (gloo needs equal sizes)."""
    from diffusers.hooks import context_parallel

    if getattr(context_parallel._all_gather_anything, "_h3core", False):
        return
    context_parallel._all_gather_anything = _padded_all_gather


def _padded_all_gather(tensor, dim: int, group):
    import torch
    import torch.distributed as dist
    from diffusers.models._modeling_parallel import gather_size_by_comm

    tensor = tensor.contiguous()
    sizes = gather_size_by_comm(tensor.shape[dim], group)
    largest = max(sizes)
    if tensor.shape[dim] < largest:
        pad = list(tensor.shape)
        pad[dim] = largest - tensor.shape[dim]
        tensor = torch.cat([tensor, tensor.new_zeros(pad)], dim=dim)
    parts = [torch.empty_like(tensor) for _ in sizes]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes, strict=True)], dim=dim)


_padded_all_gather._h3core = True  # type: ignore[attr-defined]


def _backend() -> str:
    import torch.distributed as dist

    return str(dist.get_backend())


def local_param_bytes(model) -> int:
    """Bytes of parameters this rank holds (its shards under FSDP2, everything otherwise)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total
