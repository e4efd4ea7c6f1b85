"""One rank of the step-cache case, run in a spawned process: a 2-rank group (FSDP2 and Ulysses, gloo)
runs the same jobs at each quality level in a row, and reports the steps computed and served (and,
on rank 0, the video) of each."""

from __future__ import annotations

from h3core.domain.request import GenerationRequest
from h3core.executors.distributed.rank import Payload, RankSpec, RankWorker

__all__ = ["LEVELS", "REQUEST", "cache_case"]

# An odd-length packed sequence (the prompt and the canvas): Ulysses' slices are uneven.
REQUEST = GenerationRequest(prompt="a red fox runs through deep snow!", width=64, height=64, frames=22, steps=8, seed=11)
LEVELS = ("exact", "fast", "balanced", "exact")  # the last: the group's model is as it was after the cache


def cache_case(model_dir: str, jobs: tuple[str, ...], rank: int, world: int, path: str, results) -> None:
    """Run `jobs` (quality levels) on this rank of a `world`-rank group; put (rank, what each job returned)."""
    worker = RankWorker(rank, world, RankSpec(model_dir=model_dir, threads=1, timeout_s=60))
    worker.setup(f"file://{path}")
    out = []
    for level in jobs:
        request = REQUEST.model_copy(update={"quality": level})
        got = worker.run(Payload(request=request.model_dump(mode="json"), files={}, keep_raw=True))
        assert got is not None
        out.append((level, got["cache"], got.get("raw"), got.get("audio"), got["tokens"]))
    results.put((rank, out))
