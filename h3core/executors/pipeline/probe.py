"""`h3core capacity probe`: measure this machine's token budget without weights.

Memory and time do not depend on weight values, so the probe builds the transformer and both
VAEs at a geometry (diffusers' default configs, the released model's; h3core's tiny ones; or a
model folder's configs) with random weights directly on the device, in the dtypes
`from_pretrained` would give them, and nothing is read or written but configs. Each point is one
job through the pipeline's own `Generator`, exactly as the server runs it (the same attention
plan installed the same way, diffusers' own before-denoise, denoise and decode blocks), with one
denoising step, and random prompt embeddings of the released text width in the prompt cache
standing in for the text encoder, so the packed sequence is the one a real job of that shape has.

The measurements run in a child process (`python -m h3core.executors.pipeline.probe`, one JSON
line per message) so that a memory cap is the real thing: on CUDA the caching allocator's limit
(`torch.cuda.set_per_process_memory_fraction`), raising `torch.cuda.OutOfMemoryError`; on a CPU
`RLIMIT_AS`, set once the model is built, so an allocation past it fails as torch's does
("DefaultCPUAllocator: can't allocate memory"). An out-of-memory point is recorded and the child
goes on; any other failure ends the probe with its message.
"""

from __future__ import annotations

import gc
import inspect
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from h3core.domain.geometry import CLIP
from h3core.domain.probe import GIB, Measurement, ProbeIdentity, frame_candidates, next_frames
from h3core.domain.request import GenerationRequest
from h3core.executors.pipeline.attention import DEFAULT_MATH_MAX_TOKENS, Target
from h3core.executors.pipeline.kernel_probe import decide
from h3core.executors.pipeline.model import ModelFacts, device_name

GEOMETRIES = ("released", "tiny")
DEFAULT_TEXT_TOKENS = 2048  # about what the API's longest prompt (8000 characters) makes
_PROMPT = "capacity probe"


class ProbeError(Exception):
    """The probe cannot go on (the model does not build, a non-memory failure, the child died)."""


@dataclass(frozen=True)
class ProbeSpec:
    """What the probe builds and how it measures: the geometry (or a model folder's configs), the device,
    dtype and attention kernel, the prompt's length, and the memory cap and reserve."""

    geometry: str = "released"  # "released" (diffusers' defaults) or "tiny" (h3core's tiny configs)
    model_dir: str | None = None  # take the configs (and the model's name) from this folder instead
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "auto"
    math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS
    text_tokens: int = DEFAULT_TEXT_TOKENS
    memory_cap_gib: float | None = None  # the most this process may hold on the device (weights included)
    reserve_gib: float = 0.0  # held on the device for what the probe does not build (a text encoder beside it)
    threads: int | None = None  # torch threads on a CPU
    seed: int = 0


# -- building the model ----------------------------------------------------------------------


def _configs(spec: ProbeSpec) -> tuple[dict[str, dict[str, Any]], ModelFacts, str]:
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel

    from h3core.executors.pipeline import tiny

    if spec.model_dir is not None:
        root = Path(spec.model_dir)
        configs: dict[str, dict[str, Any]] = {}
        for part, cls in (
            ("transformer", MiniMaxH3Transformer3DModel),
            ("vae", AutoencoderKLMiniMaxH3),
            ("audio_vae", AutoencoderKLMiniMaxH3Audio),
            ("scheduler", MiniMaxH3Scheduler),
            ("audio_scheduler", MiniMaxH3Scheduler),
        ):
            try:
                configs[part] = dict(cls.load_config(root / part, local_files_only=True))
            except (OSError, ValueError) as exc:
                raise ProbeError(f"cannot read {part}'s config in {root}: {exc}") from exc
        return configs, ModelFacts.read(root), str(root)
    schedulers = {"scheduler": {"shift": 12.0}, "audio_scheduler": {"shift": 3.0}}
    if spec.geometry == "tiny":
        parts = {"transformer": tiny.TRANSFORMER, "vae": tiny.VAE, "audio_vae": tiny.AUDIO_VAE}
        return {**{k: dict(v) for k, v in parts.items()}, **schedulers}, ModelFacts(name=tiny.FACTS["name"]), "tiny"
    if spec.geometry == "released":
        return {"transformer": {}, "vae": {}, "audio_vae": {}, **schedulers}, ModelFacts(), "released"
    raise ProbeError(f"geometry must be one of {', '.join(GEOMETRIES)}, not {spec.geometry!r}")


def random_model(cls, config: dict[str, Any], *, device, dtype, generator=None):
    """`cls` built from `config` with random weights, each made on `device` in the dtype that
    `from_pretrained(torch_dtype=dtype)` gives it (the class's `_keep_in_fp32_modules` stay float32)."""
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):  # parameters on meta; computed buffers stay real
        model = cls.from_config(config)
    keep = tuple(getattr(cls, "_keep_in_fp32_modules", None) or ())

    def dtype_of(name: str, tensor) -> Any:
        if not tensor.is_floating_point():
            return tensor.dtype
        return torch.float32 if any(k in name.split(".") for k in keep) else dtype

    with torch.no_grad():
        for prefix, module in model.named_modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                full = f"{prefix}.{name}" if prefix else name
                t = torch.empty(p.shape, dtype=dtype_of(full, p), device=device)
                t.normal_(0.0, 0.02, generator=generator)
                module._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
            for name, b in list(module._buffers.items()):
                if b is None:
                    continue
                persistent = name not in module._non_persistent_buffers_set  # those a checkpoint holds, in its dtype
                want = dtype_of(f"{prefix}.{name}" if prefix else name, b) if persistent else b.dtype
                module._buffers[name] = b.to(device=device, dtype=want)
    return model.eval()


class Bench:
    """The model at the spec's geometry, resident on the device, and one measurement per call."""

    def __init__(self, spec: ProbeSpec) -> None:
        import torch
        from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel

        from h3core.executors.pipeline.generate import Generator
        from h3core.executors.pipeline.model import LoadedModel, quiet_progress_bars

        quiet_progress_bars()
        self.spec = spec
        self.device = torch.device(spec.device)
        if self.device.type == "cuda" and self.device.index is None:  # torch's per-device calls want an index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = getattr(torch, spec.dtype)
        if spec.threads and self.device.type == "cpu":
            torch.set_num_threads(spec.threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if spec.memory_cap_gib is not None:
                total = torch.cuda.get_device_properties(self.device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, spec.memory_cap_gib * GIB / total), self.device)
        configs, facts, geometry = _configs(spec)
        # The same kernel choice, made and installed the same way, as the server's (Generator installs it).
        defaults = {k: p.default for k, p in inspect.signature(MiniMaxH3Transformer3DModel.__init__).parameters.items()}
        t = {**defaults, **configs["transformer"]}  # the released geometry is the class's defaults
        target = Target.detect(str(self.device), spec.dtype, int(t["num_attention_heads"]), int(t["attention_head_dim"]))
        self.plan = decide(spec.attention, target, math_max_tokens=spec.math_max_tokens).plan
        t0 = time.perf_counter()
        rng = torch.Generator(device=self.device).manual_seed(spec.seed)
        self.held = None
        if spec.reserve_gib:
            self.held = torch.ones(int(spec.reserve_gib * GIB), dtype=torch.uint8, device=self.device)
        components = {
            "transformer": random_model(
                MiniMaxH3Transformer3DModel, configs["transformer"], device=self.device, dtype=self.dtype, generator=rng
            ),
            "vae": random_model(AutoencoderKLMiniMaxH3, configs["vae"], device=self.device, dtype=self.dtype, generator=rng),
            "audio_vae": random_model(
                AutoencoderKLMiniMaxH3Audio, configs["audio_vae"], device=self.device, dtype=self.dtype, generator=rng
            ),
            "scheduler": MiniMaxH3Scheduler.from_config(configs["scheduler"]),
            "audio_scheduler": MiniMaxH3Scheduler.from_config(configs["audio_scheduler"]),
        }
        self.build_seconds = time.perf_counter() - t0
        self.text_dim = int(components["transformer"].config.text_dim)
        # Memory, not the model's clip window, is what is measured: every length is let through.
        window = ModelFacts(name=facts.name, min_seconds=0.0, max_seconds=math.inf)
        model = LoadedModel(
            Path(spec.model_dir or f"<{geometry} geometry, random weights>"), window, self.device, self.dtype, components
        )
        self.generator = Generator(model, self.plan, cache_size=1)
        self.identity = ProbeIdentity(
            device=device_name(spec.device),
            dtype=spec.dtype,
            kernel=self.plan.kernel,
            attention=self.plan.describe(),
            model=facts.name,
            geometry=geometry,
            memory_cap_gib=spec.memory_cap_gib,
            reserve_gib=spec.reserve_gib,
            text_tokens=spec.text_tokens,
        )
        self._sync()
        self.resident_bytes = self._resident()

    # -- memory -----------------------------------------------------------------------------

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _resident(self) -> int | None:
        import torch

        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return _proc_status("VmRSS")

    def _peak(self) -> int | None:
        """The peak since the last call (device memory allocated on CUDA; resident memory on a CPU)."""
        import torch

        if self.device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak
        hwm = _proc_status("VmHWM")
        _reset_peak_rss()
        return hwm

    # -- one point ---------------------------------------------------------------------------

    def measure(self, width: int, height: int, frames: int) -> Measurement:
        """Run one one-step job at this canvas and frame count: its time and peaks by stage, or the stage it
        ran out of memory in; raises `ProbeError` for any other failure."""
        import torch

        from h3core.executors.pipeline.driver import model_failure
        from h3core.executors.pipeline.generate import Control, Media

        request = GenerationRequest(prompt=_PROMPT, width=width, height=height, frames=frames, steps=1, seed=self.spec.seed)
        marks: dict[str, tuple[float, int | None]] = {}
        entered: list[str] = []

        def on_stage(stage: str) -> None:
            self._sync()  # the previous stage's kernels are done before its time and peak are read
            marks[stage] = (time.perf_counter(), self._peak())
            entered.append(stage)

        from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_TEXT_TAG

        failure = None
        try:
            with torch.no_grad():
                embeds = torch.randn(1, self.spec.text_tokens, self.text_dim, device=self.device, dtype=self.dtype)
            tags = torch.full((self.spec.text_tokens,), MINIMAX_H3_TEXT_TAG, dtype=torch.long)
            self.generator.remember_encoding(request, {"prompt_embeds": embeds, "text_token_tags": tags})
            del embeds
            self._peak()
            self.generator.run(request, Media(), Control(on_stage=on_stage))
            self._sync()
            end, decode_peak = time.perf_counter(), self._peak()
        except Exception as exc:  # noqa: BLE001 - classified: an OOM is a point, anything else ends the probe
            failure = model_failure(exc, where=str(self.device), tokens=self.generator.last_tokens)
            if failure.kind != "oom":
                raise ProbeError(f"{width}x{height}x{frames}: {failure.kind}: {failure.message}") from exc
        finally:
            # Past the handler, so the failure's traceback (and every tensor its frames hold) is gone.
            self.generator.cache.clear()
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        if failure is not None:
            return Measurement(
                width=width,
                height=height,
                frames=frames,
                outcome="oom",
                stage=entered[-1] if entered else None,
                sequence=self.generator.last_tokens,
                error=failure.message,
            )
        (t_denoise, _), (t_decode, step_peak) = marks["denoise"], marks["decode"]
        return Measurement(
            width=width,
            height=height,
            frames=frames,
            outcome="ran",
            sequence=self.generator.last_tokens,
            step_seconds=t_decode - t_denoise,
            decode_seconds=end - t_decode,
            step_peak_bytes=step_peak,
            decode_peak_bytes=decode_peak,
        )


def _proc_status(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM to the current RSS
    except OSError:
        pass


# -- the child process -----------------------------------------------------------------------


def _serve(spec: ProbeSpec, lines: Iterable[str], reply: Callable[[dict[str, Any]], None]) -> None:
    try:
        bench = Bench(spec)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which says what failed
        from h3core.executors.base import classify

        kind, message, _ = classify(exc)
        what = "the model does not fit" if kind == "oom" else "the model did not build"
        reply(
            {
                "error": f"{what} ({spec.geometry if spec.model_dir is None else spec.model_dir} geometry on {spec.device}): "
                f"{message}"
            }
        )
        return
    if spec.memory_cap_gib is not None and bench.device.type == "cpu":
        cap = int(spec.memory_cap_gib * GIB)
        size = _proc_status("VmSize") or 0
        if size >= cap:
            reply(
                {
                    "error": f"memory cap {spec.memory_cap_gib:g} GiB is below what the built model already takes "
                    f"({size / GIB:.2f} GiB of address space)"
                }
            )
            return
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    reply({"ready": bench.identity.model_dump(), "resident_bytes": bench.resident_bytes, "build_seconds": bench.build_seconds})
    for line in lines:
        ask = json.loads(line)
        try:
            reply({"measurement": bench.measure(ask["width"], ask["height"], ask["frames"]).model_dump()})
        except ProbeError as exc:
            reply({"error": str(exc)})
            return


def main() -> None:
    """The child's entry: read a `ProbeSpec` and then one point per line on stdin, answer each with one
    JSON line on stdout."""
    # The protocol has stdout to itself: anything else printed (C libraries included) goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    spec = ProbeSpec(**json.loads(sys.stdin.readline()))
    _serve(spec, sys.stdin, reply)


class ProbeProcess:
    """The measuring child, seen from the parent: `measure` sends a point and waits for it."""

    def __init__(self, spec: ProbeSpec) -> None:
        self.spec = spec
        self._log = tempfile.TemporaryFile(mode="w+")
        # Large blocks always mmapped, so a freed tensor gives its address space back (RLIMIT_AS counts it).
        env = dict(os.environ, PYTHONUNBUFFERED="1", MALLOC_MMAP_THRESHOLD_="131072")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "h3core.executors.pipeline.probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        try:
            self._send(asdict(spec))
            ready = self._receive()
        except ProbeError:
            self.close()
            raise
        self.identity = ProbeIdentity.model_validate(ready["ready"])
        self.resident_bytes: int | None = ready.get("resident_bytes")
        self.build_seconds: float = ready["build_seconds"]

    def measure(self, width: int, height: int, frames: int) -> Measurement:
        """The child's measurement of one point; raises `ProbeError` where it failed or died."""
        self._send({"width": width, "height": height, "frames": frames})
        return Measurement.model_validate(self._receive()["measurement"])

    def close(self) -> None:
        """End the child: close its input and wait for it to exit (killed after 60 s)."""
        if self._proc.poll() is None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:
            raise ProbeError(self._died()) from None

    def _receive(self) -> dict[str, Any]:
        line = self._proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise ProbeError(self._died())
        message = json.loads(line)
        if "error" in message:
            raise ProbeError(message["error"])
        return message

    def _died(self) -> str:
        code = self._proc.wait()
        self._log.seek(0)
        tail = self._log.read()[-2000:]
        return f"the measuring process ended (exit code {code}) without an answer; its last output:\n{tail}"


@contextmanager
def probe_process(spec: ProbeSpec) -> Iterator[ProbeProcess]:
    """A measuring child for `spec`, closed on exit; raises `ProbeError` where the model does not build or the child dies."""
    worker = ProbeProcess(spec)
    try:
        yield worker
    finally:
        worker.close()


def search(
    measure: Callable[[int, int, int], Measurement],
    resolutions: Iterable[tuple[int, int]],
    *,
    max_frames: int,
    start: int,
    growth: float = 2.0,
    precision: int = CLIP,
    on_point: Callable[[Measurement], None] = lambda m: None,
) -> list[Measurement]:
    """Measure each canvas's boundary in turn (the choice of points is `next_frames`)."""
    out = []
    candidates = frame_candidates(max_frames)
    for width, height in resolutions:
        trials: dict[int, Any] = {}
        while (frames := next_frames(candidates, trials, start=start, growth=growth, precision=precision)) is not None:
            m = measure(width, height, frames)
            trials[frames] = m.outcome
            out.append(m)
            on_point(m)
    return out


if __name__ == "__main__":
    main()
