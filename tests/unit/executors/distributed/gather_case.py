"""One rank of the uneven all-gather case, run in a spawned process: it imports torch and
`sharding` only, not diffusers, which the test module needs and which takes seconds to import."""

from __future__ import annotations

import torch
import torch.distributed as dist

from h3core.executors.distributed import sharding


def gather_case(rank: int, world: int, path: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        mine = torch.full((2, 3 + rank, 4), float(rank))  # uneven along dim 1: 3 and 4 rows
        try:
            dist.all_gather([torch.empty(2, 3 + r, 4) for r in range(world)], mine)
            plain = "gathered"
        except RuntimeError as exc:
            plain = str(exc)
        gathered = sharding._padded_all_gather(mine, 1, dist.group.WORLD)
        results.put((rank, plain, gathered.shape, gathered[0, :, 0].tolist()))
    finally:
        dist.destroy_process_group()
