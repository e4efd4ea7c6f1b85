"""The pipeline executor: where a job's time goes, cold and warm, and what attention costs.

    python -m bench.throughput.pipeline                       # tiny random model on the CPU; 8 steps, 64x64, 22 frames
    python -m bench.throughput.pipeline --attention-only --seq 512,1024,2048,4096,8192
    python -m bench.throughput.pipeline --model-dir /weights/MiniMax-H3 --device cuda --dtype bfloat16 \
        --size 768x1344 --frames 124 --steps 50                 # real weights, where there are some

Before part 1 it decides the attention kernel as the executor does at start (`kernel_probe.at_start`:
the probe's table, then the plan). Part 1 loads the model (cold), then runs three jobs through `generate.Generator`, the code the
executor runs: a first prompt, a new prompt (warm model, text encoder runs), and the same
prompt again (warm, embeddings cached). It times every stage plus the mp4 mux (PyAV) and says
which share of each job is not denoising: each row splits the job into load, encode (text encoder),
condition (keyframe/reference VAE encoding), denoise (layout, noise, the step loop), decode (both
VAEs) and mux (H.264 + AAC through PyAV). Without `--model-dir` it writes the tiny random model
first (not timed).

Part 2 measures one attention call (batch 1, 4 heads, head dim 64) per kernel (`--kernels`) and
sequence length, each in a fresh process (`python -m bench.throughput.pipeline --one-call`): on CUDA
the peak of torch's allocator over the call, on a CPU the growth of the process's peak RSS over the
call (the kernel's peak mark is reset first through /proc/self/clear_refs). Linear kernels double
when the sequence doubles; MATH quadruples (it materialises the whole score matrix). On a GPU the
same stage table is step 4 of the GPU check (bench/gpu/README.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, console, parse, print_machine, show, table

KERNELS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def jobs(args) -> None:
    from h3core.adapters.video import write_mp4
    from h3core.domain.request import GenerationRequest
    from h3core.executors.pipeline.generate import Control, Generator, Media
    from h3core.executors.pipeline.kernel_probe import at_start
    from h3core.executors.pipeline.kernel_probe import table as probe_table
    from h3core.executors.pipeline.model import load_model
    from h3core.executors.pipeline.tiny import make_tiny

    tmp = Path(tempfile.mkdtemp(prefix="h3-bench-pipeline-", dir=getattr(args, "workdir", None)))
    model_dir = Path(args.model_dir) if args.model_dir else make_tiny(tmp / "tiny")
    t0 = time.perf_counter()
    decision = at_start(model_dir, args.device, args.dtype, args.attention)  # what the executor does at start
    probe = time.perf_counter() - t0
    console.print("\n".join(probe_table(decision)) + f"\n(decided in {probe:.2f} s)\n")
    t0 = time.perf_counter()
    model = load_model(model_dir, device=args.device, dtype=args.dtype)
    generator = Generator(model, decision.plan)
    load = time.perf_counter() - t0
    height, width = (int(v) for v in args.size.split("x"))
    base = dict(width=width, height=height, frames=args.frames, steps=args.steps, seed=1)
    runs = [
        ("cold: load + first job", "a red fox running through fresh snow at dawn", load),
        ("warm, new prompt", "a heron standing in a misty river", 0.0),
        ("warm, same prompt", "a heron standing in a misty river", 0.0),
    ]
    t = table(
        f"One job, stage by stage ({model.facts.name}, {height}x{width}, {args.frames} frames, {args.steps} steps, "
        f"{args.device} {args.dtype}, attention {generator.plan.kernel})",
        ["job", "load s", "encode s", "condition s", "denoise s", "per step ms", "decode s", "mux s", "total s", "not denoising"],
        caption=(
            "encode = before_encode + text encoder (0 when the embeddings are cached); condition = VAE encoding of keyframes/"
            "references; denoise = layout + noise + the step loop; mux = H.264 + AAC through PyAV. `not denoising` is the "
            "share of the total (load included) outside the step loop."
        ),
    )
    for label, prompt, load_s in runs:
        request = GenerationRequest(prompt=prompt, **base)
        out = generator.run(request, Media(), Control())
        m0 = time.perf_counter()
        write_mp4(tmp / "out.mp4", out.frames, fps=24, audio=out.audio, sample_rate=out.sample_rate)
        mux = time.perf_counter() - m0
        s = out.seconds
        encode = s.get("before_encode", 0.0) + s.get("text_encoder", 0.0)
        steps = sum(out.step_seconds)
        total = load_s + sum(s.values()) + mux
        t.add_row(
            label,
            f"{load_s:.3f}",
            f"{encode:.3f}" if out.encoded else "0 (cached)",
            f"{s.get('vae_encoder', 0):.3f}",
            f"{s['denoise']:.3f}",
            f"{steps / max(out.steps, 1) * 1000:.1f}",
            f"{s['decode']:.3f}",
            f"{mux:.3f}",
            f"{total:.3f}",
            f"{(total - steps) / total:.0%}",
        )
    show(t)
    parts = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(model.load_seconds.items(), key=lambda kv: -kv[1]))
    console.print(f"load by component: {parts}\n")


def one_call(kernel: str, seq: int, device: str, dtype: str) -> dict:
    """Runs in a fresh interpreter: the memory one attention call needs on top of its inputs."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev, dt = torch.device(device), getattr(torch, dtype)
    q, k, v = (torch.randn(1, 4, seq, 64, device=dev, dtype=dt) for _ in range(3))
    with sdpa_kernel([getattr(SDPBackend, kernel)]):
        try:
            F.scaled_dot_product_attention(q[:, :, :64], k[:, :, :64], v[:, :, :64])  # load the kernel first
        except RuntimeError as exc:
            return {"error": str(exc).splitlines()[0][:60]}
        if dev.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        else:
            base = _reset_peak_rss()
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
        else:
            peak = max(0, _status_bytes("VmHWM") - base)
        seconds = time.perf_counter() - t0
    del out
    return {"bytes": peak, "ms": seconds * 1000}


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0: clear_refs 5); returns the RSS now."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def attention(args) -> None:
    seqs = [int(s) for s in args.seq.split(",")]
    how = (
        "torch allocator peak over the call"
        if args.device.startswith("cuda")
        else "growth of the process's peak RSS over the call, peak mark reset just before it"
    )
    t = table(
        f"One attention call: extra memory by kernel and sequence length ({args.device}, {args.dtype}, 4 heads x 64)",
        ["kernel", *[f"{s} tokens" for s in seqs], "growth per 2x tokens"],
        caption=f"MiB ({how}), then milliseconds; each cell is a fresh process. `-` = the kernel does not run here.",
    )
    for kernel in [k for k in args.kernels.split(",") if k]:
        cells, sizes = [], []
        for seq in seqs:
            cmd = [sys.executable, "-m", __spec__.name, "--one-call", json.dumps([kernel, seq, args.device, args.dtype])]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)  # cwd: where `bench` imports from
            res = json.loads(done.stdout.strip().splitlines()[-1])
            if "error" in res:
                cells.append("-")
                continue
            sizes.append(res["bytes"])
            cells.append(f"{res['bytes'] / 2**20:,.1f} MiB / {res['ms']:,.1f} ms")
        ratios = [b / a for a, b in zip(sizes, sizes[1:], strict=False) if a > 0]
        growth = f"x{sum(ratios) / len(ratios):.1f}" if ratios and len(seqs) > 1 else "-"
        t.add_row(kernel.split("_")[0].lower(), *cells, growth)
    show(t)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attention", default="auto")
    p.add_argument("--size", default="64x64", help="HEIGHTxWIDTH")
    p.add_argument("--frames", type=int, default=22)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seq", default="1024,2048,4096,8192")
    p.add_argument("--kernels", default=",".join(KERNELS), help="SDPA kernels of part 2 (default: all four)")
    p.add_argument("--attention-only", action="store_true")
    p.add_argument("--workdir", type=Path, default=None, help="where the tiny model and a video go (default: a new temp dir)")
    p.add_argument("--one-call", help=argparse.SUPPRESS)
    args = parse(p, argv, __spec__.name)
    if args.one_call:
        print(json.dumps(one_call(*json.loads(args.one_call))))
        return
    print_machine(tempfile.gettempdir(), "Machine")
    import torch

    console.print(
        f"torch {torch.__version__}, cuda {'yes: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no'}\n"
    )
    if not args.attention_only:
        jobs(args)
    attention(args)


if __name__ == "__main__":
    main()
