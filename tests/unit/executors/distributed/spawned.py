"""Ranks of a gloo group as spawned processes on this machine, for the cases that need real collectives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

__all__ = ["run_ranks"]


def run_ranks(target: Callable[..., None], store: Path, *, world: int = 2, timeout_s: float = 120.0) -> list[Any]:
    """Run `target(rank, world, store, results)` in `world` spawned processes (each puts one tuple, its rank
    first, in `results`); the tuples by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, world, str(store), results)) for rank in range(world)]
    for p in procs:
        p.start()
    got = sorted((results.get(timeout=timeout_s) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(timeout=30)
    return got
