"""One rank of the agreement case, run in a spawned process: at each boundary every rank offers
its own (stop, checkpoint) and `SyncedStop` must hand back rank 0's, whatever the others offered."""

from __future__ import annotations

import torch
import torch.distributed as dist

from h3core.executors.distributed.rank import SyncedStop

__all__ = ["OFFERS", "agree_case"]

# Per boundary, what each rank offers: (rank 0's, rank 1's). Rank 1's clock (or a stop flag of its own)
# may say otherwise; only rank 0's counts.
OFFERS = [
    ((False, False), (True, True)),
    ((False, True), (False, False)),
    ((True, False), (False, True)),
    ((True, True), (True, True)),
]


def agree_case(rank: int, world: int, path: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        synced = SyncedStop(rank, world, torch.device("cpu"))
        got = []
        for offers in OFFERS:
            stop, save = synced.agree(*offers[rank])
            got.append((stop, save, synced.agreed_at > 0))
            synced.agreed_at = 0.0
        results.put((rank, got))
    finally:
        dist.destroy_process_group()
