"""Groups of ranks (Ray actors): 1 rank against 2, each way of splitting the model.

    python -m bench.throughput.groups                                   # tiny model, CPU, gloo
    python -m bench.throughput.groups --size 128x128 --frames 39 --steps 8 --jobs 3
    python -m bench.throughput.groups --model-dir /weights --device cuda --dtype bfloat16 \
        --size 768x1344 --frames 124 --steps 50 --configs 1,fsdp                 # on GPUs

For every configuration (1 rank; 2 ranks with FSDP2, Ulysses, both) the script builds a group
through `distributed.group.Group`, the code the executor runs, and reports:

- **cold start**: from nothing to a group that can take a job (actors, process group, model load);
- **warm job**: wall time of a job after the first, and the median denoising step;
- **memory per rank**: parameter bytes the rank holds, and its peak over one warm job (the CUDA
  allocator's peak on a GPU; on a CPU the process's peak RSS, reset before the job, so it
  includes the resident text encoder and VAEs);
- **collective share**: on rank 0, over one warm job, the time spent at every place a rank waits
  for its partners (FSDP2's parameter all-gathers, Ulysses' all-to-alls and size exchanges, the
  sequence gather, the stop flag's all-reduce; each wrapped with a timer) over the denoising
  time. Waiting for a slower partner counts as collective time;
- **rebuild**: after rank 1 is killed (SIGKILL) while idle, how long until a ping finds it gone,
  and how long a new group takes to build.

Every job of a run uses the same request and seed. The machine table says where it ran; on a
2-core machine two ranks share the cores, so 2-rank step times there show the overhead of the
split, not a speed-up.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import console, parse, print_machine, show, table
from bench.throughput import _rank_probes as probes

CONFIGS = {"1": (1, False, False), "fsdp": (2, True, False), "ulysses": (2, False, True), "fsdp+ulysses": (2, True, True)}


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", help="a diffusers-layout MiniMax-H3 folder (default: the tiny random model)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--size", default="64x64", help="HEIGHTxWIDTH")
    p.add_argument("--frames", type=int, default=22)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--jobs", type=int, default=3, help="warm jobs per configuration (after one cold job)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank on a CPU")
    p.add_argument("--configs", default="1,fsdp,ulysses,fsdp+ulysses")
    args = parse(p, argv, __spec__.name)

    import ray

    from h3core.domain.request import GenerationRequest
    from h3core.domain.topology import GroupPlan
    from h3core.executors.distributed.cluster import ClusterSettings, connect
    from h3core.executors.distributed.group import Group
    from h3core.executors.distributed.rank import Payload, RankSpec
    from h3core.executors.pipeline.generate import Control
    from h3core.executors.pipeline.kernel_probe import at_start
    from h3core.executors.pipeline.tiny import make_tiny

    tmp = Path(tempfile.mkdtemp(prefix="h3-bench-groups-"))
    print_machine(tmp, "Machine")
    model_dir = Path(args.model_dir) if args.model_dir else make_tiny(tmp / "tiny")
    # The kernel every rank runs, decided as the executor decides it (in a child: the GPUs are the ranks').
    kernel = at_start(model_dir, args.device, args.dtype, "auto", in_child=args.device == "cuda").plan.kernel
    connect(ClusterSettings(), ranks=2)
    ray.cloudpickle.register_pickle_by_value(probes)
    height, width = (int(v) for v in args.size.split("x"))
    request = GenerationRequest(
        prompt="a red fox running through fresh snow at dawn",
        width=width,
        height=height,
        frames=args.frames,
        steps=args.steps,
        seed=1,
    )
    payload = Payload(request=request.model_dump(mode="json"), files={})

    speed = table(
        f"Cold start and warm jobs ({height}x{width}, {args.frames} frames, {args.steps} steps, {args.device} {args.dtype}, "
        f"{args.threads} thread(s) per rank)",
        ["configuration", "cold start s", "first job s", "warm job s", "step ms (median)", "collectives % of denoise"],
        caption="cold start: actors + process group + model load, ranks loading in parallel. warm job: median of "
        f"{args.jobs} jobs after the first. collectives: rank 0, one warm job, timed at each collective call site.",
    )
    memory = table(
        "Memory per rank (one warm job)",
        ["configuration", "rank", "transformer params MiB", "peak MiB"],
        caption="peak: the CUDA allocator's peak on a GPU; on a CPU the rank's peak RSS over the job (whole process: "
        "text encoder, VAEs and torch included).",
    )
    heal = table(
        "Self-healing: rank 1 killed while idle",
        ["configuration", "ping finds it s", "rebuild s"],
        caption="ping: from SIGKILL to `Group.ping` reporting the dead rank (the watchdog's check); rebuild: a new group, cold.",
    )
    for name in args.configs.split(","):
        size, fsdp, ulysses = CONFIGS[name]
        spec = RankSpec(
            model_dir=str(model_dir),
            device=args.device,
            dtype=args.dtype,
            attention=kernel,
            fsdp=fsdp,
            ulysses=ulysses,
            threads=args.threads,
        )
        group = Group(GroupPlan(index=0, devices=tuple(range(size))), spec)
        try:
            group.build()
            cold = group.health.build_seconds or 0.0
            t0 = time.perf_counter()
            group.run(payload, Control(), stop_timeout_s=600)
            first = time.perf_counter() - t0
            walls, steps = [], []
            for _ in range(args.jobs):
                t0 = time.perf_counter()
                out = group.run(payload, Control(), stop_timeout_s=600)
                walls.append(time.perf_counter() - t0)
                steps.extend(out["step_seconds"])
            # One more warm job, measured: peaks reset, rank 0 profiled.
            ray.get([a.__ray_call__.remote(probes.reset_peak) for a in group.actors])
            profiled = size > 1
            if profiled:
                ray.get(group.actors[0].__ray_call__.remote(probes.start_comm_timer))
            out = group.run(payload, Control(), stop_timeout_s=600)
            comm = ray.get(group.actors[0].__ray_call__.remote(probes.stop_comm_timer)) if profiled else {}
            denoise_ms = out["seconds"]["denoise"] * 1000
            share = f"{100 * sum(comm.values()) / denoise_ms:.0f}" if profiled else "-"
            speed.add_row(
                name,
                f"{cold:.1f}",
                f"{first:.2f}",
                f"{statistics.median(walls):.2f}",
                f"{1000 * statistics.median(steps):.1f}",
                share,
            )
            peaks = ray.get([a.__ray_call__.remote(probes.peak) for a in group.actors])
            for rank, (info, top) in enumerate(zip(group.health.ranks, peaks, strict=True)):
                memory.add_row(name, str(rank), mib(info["param_bytes"]), mib(top))
            if size > 1:
                victim = ray.get(group.actors[1].__ray_call__.remote(probes.pid))
                os.kill(victim, signal.SIGKILL)
                t0 = time.perf_counter()
                while group.ping(timeout_s=10) is None:
                    time.sleep(0.05)
                found = time.perf_counter() - t0
                group.build()
                heal.add_row(name, f"{found:.2f}", f"{group.health.build_seconds:.1f}")
            if comm:
                console.print(f"collectives on rank 0 ({name}): " + ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(comm.items())))
        finally:
            group.teardown()
    show(speed)
    show(memory)
    show(heal)


if __name__ == "__main__":
    main()
