"""One rank of a group: a process that holds its share of the model and runs every job of its
group in lockstep with the other ranks (Ray hosts it as an actor; tests may host it directly).

Every rank runs the same stages of the same job in the same order, so every collective meets
its partners. Rank 0 is the group's voice: it reports steps and stages and returns the video;
the other ranks stop after denoising. A stop is decided by rank 0 and agreed at each step
boundary with one all-reduce, so every rank leaves the loop at the same step and none is left
waiting in a collective.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h3core.domain.request import GenerationRequest
from h3core.executors.pipeline.attention import Target, plan_for
from h3core.executors.pipeline.driver import model_failure
from h3core.executors.pipeline.generate import Control, Generator, Media, StopRequested

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RankSpec:
    """What every rank of a group loads and how it runs: the model folder, device and dtype, the attention
    kernel decided at start, sharding (`fsdp`) and sequence parallelism (`ulysses`), and the bound on a
    collective."""

    model_dir: str
    device: str = "cpu"  # "cpu" or "cuda" (Ray gives each rank its own GPU as cuda:0)
    dtype: str = "float32"
    attention: str = "flash"  # the kernel the executor decided on at start (every rank runs the same one)
    math_max_tokens: int = 4096
    prompt_cache: int = 32
    fsdp: bool = True
    ulysses: bool = True
    timeout_s: float = 60.0  # bound on every collective
    threads: int | None = None  # torch intra-op threads on a CPU (None: torch's default)
    placement: tuple[tuple[str, str], ...] = ()  # ("text_encoder", "cpu"), ...; "cuda" is the rank's GPU


@dataclass(frozen=True)
class Payload:
    """One job as every rank receives it: the request, and its uploads as bytes (ranks may be on another node)."""

    request: dict[str, Any]
    files: dict[str, tuple[tuple[str, bytes], ...]]  # role -> ((file name, bytes), ...)
    keep_raw: bool = False


class SyncedStop:
    """The stop flag of a group: set locally on rank 0, read by all ranks through one all-reduce.

    `is_set()` is a collective: every rank calls it at the same points (before each stage and after
    each step, which `Generator` guarantees), and all get rank 0's answer.
    """

    def __init__(self, local: threading.Event, device, world: int) -> None:
        self.local = local
        self.device = device
        self.world = world

    def set(self) -> None:
        """Set the local flag (rank 0's is the one every rank reads)."""
        self.local.set()

    def is_set(self) -> bool:
        """Rank 0's flag, on every rank (a collective with more than one rank)."""
        if self.world == 1:
            return self.local.is_set()
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.local.is_set() else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class RankWorker:
    """One rank of a group: `setup` loads its share of the model, `run` runs each job in lockstep with
    the other ranks; `poll`, `stop` and `ping` answer from other threads while a job runs."""

    def __init__(self, rank: int, world: int, spec: RankSpec) -> None:
        self.rank = rank
        self.world = world
        self.spec = spec
        self.generator: Generator | None = None
        self.device: torch.device | None = None  # from `setup`
        self.events: deque[tuple] = deque()
        self._stop = threading.Event()
        self.busy = False
        self.jobs = 0
        self.facts: dict[str, Any] = {}

    # -- set-up -------------------------------------------------------------------------------

    def rendezvous(self) -> str:
        """Where the group meets (asked of rank 0): a new file on this node, for torch's file store.

        A group never spans nodes, and a file opens no port (torch's TCP store listens on every
        interface). The folder is new for every build, so a crashed group's file is never reused.
        """
        return "file://" + str(Path(tempfile.mkdtemp(prefix="h3core-group-")) / "rendezvous")

    def setup(self, rendezvous: str) -> dict[str, Any]:
        """Join the group's process group at `rendezvous` (with more than one rank) and load the model, the
        transformer sharded over the ranks; returns what this rank reports of itself (pid, device, kernel,
        load time, parameter bytes)."""
        import torch

        from h3core.executors.distributed import sharding
        from h3core.executors.pipeline.model import attention_geometry, load_model

        t0 = time.perf_counter()
        s = self.spec
        if s.threads and s.device == "cpu":
            torch.set_num_threads(s.threads)
        self.device = torch.device("cuda", 0) if s.device == "cuda" else torch.device(s.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        heads, head_dim = attention_geometry(Path(s.model_dir))
        target = Target.detect(str(self.device), s.dtype, heads, head_dim)
        plan = plan_for(s.attention, target, math_max_tokens=s.math_max_tokens)
        loader = None
        if self.world > 1:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            sharding.init_group(rank=self.rank, world=self.world, rendezvous=rendezvous, backend=backend, timeout_s=s.timeout_s)
            mesh = sharding.make_mesh(self.device.type, self.world)
            dtype = getattr(torch, s.dtype)

            def loader(path: Path):
                model = sharding.load_transformer(path, dtype=dtype, device=self.device, mesh=mesh, fsdp=s.fsdp)
                if s.ulysses:
                    sharding.enable_ulysses(model, mesh, self.device)
                return model

        placement = {part: str(self.device) if where == "cuda" else where for part, where in s.placement}
        model = load_model(
            Path(s.model_dir), device=str(self.device), dtype=s.dtype, load_transformer=loader, placement=placement
        )
        self.generator = Generator(model, plan, cache_size=s.prompt_cache)
        self.facts = {
            "rank": self.rank,
            "pid": os.getpid(),
            "device": str(self.device),
            "attention": plan.describe(),
            "load_seconds": time.perf_counter() - t0,
            "param_bytes": sharding.local_param_bytes(model.components["transformer"]),
        }
        return self.facts

    # -- jobs ---------------------------------------------------------------------------------

    def run(self, payload: Payload) -> dict[str, Any] | None:
        """One job; rank 0 returns the video, the others a summary. None: stopped as asked."""
        assert self.generator is not None, "setup() first"
        self.busy = True
        self.jobs += 1
        self._stop.clear()
        self.events.clear()
        control = Control(stop=SyncedStop(self._stop, self.device, self.world), decode=self.rank == 0, keep_raw=payload.keep_raw)  # type: ignore[arg-type]
        if self.rank == 0:
            control.on_step = lambda step, total: self.events.append(("step", step, total))
            control.on_stage = lambda stage: self.events.append(("stage", stage))
        request = GenerationRequest.model_validate(payload.request)
        try:
            with tempfile.TemporaryDirectory(prefix="h3-rank-") as tmp:
                out = self.generator.run(request, _media(payload, Path(tmp)), control)
        except StopRequested:
            return None
        except Exception as exc:  # noqa: BLE001 - classified here, where the tokens and the device are known
            where = f"rank {self.rank} ({self.device})"
            raise model_failure(exc, where=where, tokens=self.generator.last_tokens) from None
        finally:
            self.busy = False
        summary = {
            "rank": self.rank,
            "steps": out.steps,
            "seconds": out.seconds,
            "step_seconds": out.step_seconds,
            "tokens": self.generator.last_tokens,
        }
        if self.rank != 0:
            return summary
        return {**summary, "frames": out.frames, "audio": out.audio, "sample_rate": out.sample_rate, "raw": out.raw}

    def poll(self) -> list[tuple]:
        """What rank 0 has reported since the last poll."""
        out = []
        while self.events:
            out.append(self.events.popleft())
        return out

    def stop(self) -> None:
        """Ask the running job to stop (on rank 0: every rank stops at the same step boundary)."""
        self._stop.set()

    def ping(self) -> dict[str, Any]:
        """The rank's rank, pid, whether it runs a job, and how many it has run."""
        return {"rank": self.rank, "pid": os.getpid(), "busy": self.busy, "jobs": self.jobs}


def _media(payload: Payload, folder: Path) -> Media:
    def write(role: str) -> tuple[Path, ...]:
        paths = []
        for i, (name, data) in enumerate(payload.files.get(role, ())):
            path = folder / f"{role}-{i}-{Path(name).name}"
            path.write_bytes(data)
            paths.append(path)
        return tuple(paths)

    first, last = write("first"), write("last")
    return Media(
        first=first[0] if first else None,
        last=last[0] if last else None,
        images=write("images"),
        videos=write("videos"),
        audios=write("audios"),
    )
