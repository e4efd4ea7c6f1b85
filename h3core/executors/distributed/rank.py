"""One rank of a group: a process that holds its share of the model and runs every job of its
group in lockstep with the other ranks (Ray hosts it as an actor; tests may host it directly).

Every rank runs the same stages of the same job in the same order, so every collective meets
its partners. Rank 0 is the group's voice: it reports steps and stages and returns the video;
the other ranks stop after denoising. Whether to stop, and whether to checkpoint the step just
done, is decided by rank 0 and agreed before each stage and after each step with one broadcast
(`SyncedStop`), so every rank leaves the loop at the same step, none is left waiting in a
collective, and all count the same checkpoints even where the policy counts seconds.

Checkpoints: every rank holds the whole loop state (the latents, both schedulers, the
generator), the same on each: FSDP2 shards only the weights, each rank still computing the
whole forward, and Ulysses splits the sequence inside the transformer only (its `_cp_plan`
gathers `proj_out` and `audio_proj_out`), so the scheduler steps whole, identical latents on
every rank. Rank 0 alone copies that state off its device (all its loop waits for), serialises
it in a thread of its own and hands it to the driver through its events (an object in Ray's
store); the driver writes it. A checkpoint to continue from goes to every rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h3core.domain.checkpoints import CheckpointPolicy
from h3core.domain.request import GenerationRequest
from h3core.executors.pipeline.attention import Target, plan_for
from h3core.executors.pipeline.driver import Background, model_failure
from h3core.executors.pipeline.generate import Control, Generator, Media, StopRequested, load_checkpoint, save_checkpoint

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
    """One job as every rank receives it: the request, and its uploads as bytes (ranks may be on another node);
    when to checkpoint (rank 0 decides), the checkpoint to continue from (every rank loads it)."""

    request: dict[str, Any]
    files: dict[str, tuple[tuple[str, bytes], ...]]  # role -> ((file name, bytes), ...)
    keep_raw: bool = False
    checkpoints: dict[str, Any] | None = None  # a CheckpointPolicy's fields; None: never
    resume: bytes | None = field(default=None, repr=False)  # a checkpoint's bytes (`save_checkpoint`'s)
    # Every rank also returns a digest of the loop state at each agreed checkpoint: that the ranks hold one
    # state (a check, for tests: it costs every rank the copy off its device).
    check_state: bool = False


@dataclass(frozen=True)
class Serialised:
    """A checkpoint rank 0 made: its step, its bytes (`data`: an object in Ray's store), how long the loop
    waited for it (the copy off the device, and any checkpoint before it still being serialised) and how long
    serialising it took."""

    step: int
    total: int
    data: Any  # ray.ObjectRef to bytes
    paused_s: float
    serialise_s: float


class SyncedStop:
    """The decisions of a group at a stage or step boundary, agreed by all ranks: rank 0 decides, the others
    follow. `agree` is a collective: every rank calls it at the same points (before each stage and after each
    step, which `Generator` guarantees), and all get rank 0's answer: only rank 0's stop flag is ever set (the
    driver asks rank 0), and only rank 0 keeps the checkpoint policy and a clock that counts (the others' would
    say otherwise).
    """

    def __init__(self, rank: int, world: int, device) -> None:
        self.rank = rank
        self.world = world
        self.device = device
        self.agreed_at = 0.0  # when the last checkpoint was agreed (perf_counter): where its pause starts

    def agree(self, stop: bool, save: bool) -> tuple[bool, bool]:
        """(stop, checkpoint) as rank 0 decided them, on every rank (a broadcast with more than one rank)."""
        if self.world > 1:
            import torch
            import torch.distributed as dist

            flags = torch.tensor([float(stop), float(save)], device=self.device)
            dist.broadcast(flags, src=0)
            stop, save = (bool(f) for f in flags.tolist())
        if save:
            self.agreed_at = time.perf_counter()
        return stop, save


class Serialiser:
    """Rank 0's checkpoints: its loop hands each over on the host, and waits for nothing more (but a checkpoint
    before it still being serialised); each is serialised in a thread of its own, put in Ray's store and
    queued for the driver (`events`)."""

    def __init__(self, events: deque[tuple], synced: SyncedStop, put: Callable[[bytes], Any]) -> None:
        self.events = events
        self.synced = synced
        self.put = put
        self._work = Background("h3-rank0-checkpoint")

    def hand(self, held: dict[str, Any]) -> None:
        """Serialise `held` in the background; called from the loop's thread, right after the copy."""
        self._work.drain()
        paused = time.perf_counter() - self.synced.agreed_at
        self._work.begin(lambda: self._serialise(held, paused))

    def finishing(self) -> contextlib.AbstractContextManager[None]:
        """On leaving the block, wait until every checkpoint handed over is queued for the driver (as
        `Background.finishing` does)."""
        return self._work.finishing()

    def _serialise(self, held: dict[str, Any], paused: float) -> None:
        t0 = time.perf_counter()
        data = self.put(save_checkpoint(held))
        self.events.append(("checkpoint", Serialised(held["step"], held["total"], data, paused, time.perf_counter() - t0)))


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
        self._control: Control | None = None  # the running job's
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
        synced = SyncedStop(self.rank, self.world, self.device)
        control = Control(stop=self._stop, agree=synced.agree, decode=self.rank == 0, keep_raw=payload.keep_raw)
        serialiser: Serialiser | None = None
        digests: dict[int, str] = {}
        if self.rank == 0:
            control.on_step = lambda step, total: self.events.append(("step", step, total))
            control.on_stage = lambda stage: self.events.append(("stage", stage))
            if payload.checkpoints is not None:
                import ray

                control.checkpoints = CheckpointPolicy.model_validate(payload.checkpoints)
                serialiser = Serialiser(self.events, synced, ray.put)
                control.on_checkpoint = serialiser.hand
        if payload.check_state:
            hand = control.on_checkpoint

            def check(held: dict[str, Any]) -> None:
                digests[held["step"]] = state_digest(held)
                if hand is not None:
                    hand(held)

            control.on_checkpoint = check
        self._control = control
        request = GenerationRequest.model_validate(payload.request)
        try:
            if payload.resume is not None:
                control.resume = load_checkpoint(payload.resume)
            # Every checkpoint handed over is queued before the run's end is (the one a stop asked for too).
            with serialiser.finishing() if serialiser is not None else contextlib.nullcontext():
                with tempfile.TemporaryDirectory(prefix="h3-rank-") as tmp:
                    out = self.generator.run(request, _media(payload, Path(tmp)), control)
        except StopRequested:
            return None
        except Exception as exc:  # noqa: BLE001 - classified here, where the tokens and the device are known
            where = f"rank {self.rank} ({self.device})"
            raise model_failure(exc, where=where, tokens=self.generator.last_tokens) from None
        finally:
            self._control = None
            self.busy = False
        summary = {
            "rank": self.rank,
            "steps": out.steps,
            "seconds": out.seconds,
            "step_seconds": out.step_seconds,
            "tokens": self.generator.last_tokens,
            "checkpoints": out.checkpoints,
            "digests": digests,
            "cache": out.cache,  # the same counts on every rank: the decisions are the group's
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

    def stop(self, save: bool = False) -> None:
        """Ask the running job to stop (on rank 0: every rank stops at the same step boundary); `save`: and to
        checkpoint the last step it reaches (h3core's own stop)."""
        control = self._control
        if save and control is not None:
            control.save_on_stop = True  # before the flag: the boundary that sees the stop sees this too
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


def state_digest(held: dict[str, Any]) -> str:
    """A sha256 of a checkpoint's loop state: the latents' bytes, both schedulers, the generator's state."""
    import torch

    digest = hashlib.sha256(repr((held["step"], held["scheduler"], held["audio_scheduler"])).encode())
    for key in ("latents", "audio_latents", "generator"):
        value = held[key]
        if value is not None:
            digest.update(value.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
