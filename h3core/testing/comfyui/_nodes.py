"""What the fake nodes do when they run, keyed by class name (their specs are the registry's JSON).

Nodes do no real work: they sleep, count progress and pass tokens along (`_values.py`); output nodes
write real files (`_media.py`). A behaviour is async (worker, run, node id, one call's inputs) ->
(outputs, ui or None); a class without one returns a fresh token per output.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._failures import EXEC_FRAMES, OOM_MESSAGE, ROOT, NodeFailure, sampler_frame
from ._log import tqdm
from ._media import WEBP, png_bytes, png_size, save_images, save_path, write_video
from ._system import RAM_TOTAL
from ._values import Audio, Images, Latent, Sigmas, Token, Video

if TYPE_CHECKING:
    from ._worker import Run, Worker

Behaviour = Callable[["Worker", "Run", str, dict[str, Any]], Awaitable[tuple[tuple[Any, ...], dict[str, Any] | None]]]

BEHAVIOURS: dict[str, Behaviour] = {}
SAMPLER_NODES = frozenset({"KSampler", "KSamplerAdvanced", "SamplerCustomAdvanced", "XFuserSamplerCustomAdvanced"})
# Their time is `step_seconds` a step; every other node's is `node_seconds` a call.
TIMED_BY_STEPS = SAMPLER_NODES | {"SaveImageWebsocket"}
# Called once with whole input lists, not once per item (ComfyUI's INPUT_IS_LIST).
INPUT_IS_LIST = frozenset({"RebatchImages"})


def _does(*class_types: str) -> Callable[[Behaviour], Behaviour]:
    def register(behaviour: Behaviour) -> Behaviour:
        for class_type in class_types:
            BEHAVIOURS[class_type] = behaviour
        return behaviour

    return register


# -- sampling -----------------------------------------------------------------------------------------------


async def _sample(w: Worker, run: Run, uid: str, steps: int) -> None:
    """A sampler's steps: the step-wise fault switches, tqdm lines in the log, progress ticks."""
    s = w.switches
    class_type = run.prompt[uid]["class_type"]
    ray = class_type == "XFuserSamplerCustomAdvanced"
    checks = s.send_progress if s.sampler_checks_interrupt is None else s.sampler_checks_interrupt
    started = time.monotonic()
    logged = False
    try:
        for i in range(1, steps + 1):
            await asyncio.sleep(s.step_seconds)
            if s.drop_sockets_at_step == i:
                s.drop_sockets_at_step = None
                w.sockets.drop_all_in_turn()
            if s.oom_at_step == i:
                raise NodeFailure("torch.OutOfMemoryError", OOM_MESSAGE, EXEC_FRAMES + [sampler_frame(class_type)])
            if s.error_at_step == i:
                raise NodeFailure("RuntimeError", "boom", EXEC_FRAMES + [sampler_frame(class_type)])
            if s.log_progress:
                bar = tqdm(i, steps, time.monotonic() - started)
                if ray:  # one line per GPU, as Ray forwards each worker's stderr
                    w.log.write("".join(f"\x1b[36m(RayWorker pid={4100 + r})\x1b[0m {r}: {bar}\n" for r in range(max(1, s.gpus))))
                else:
                    w.log.write(f"\r{bar}")
                    logged = True
            run.step = i
            if s.send_progress:
                w.progress(run, uid, i, steps, check=checks)
            elif checks:
                w.check_interrupt()
    finally:
        if logged:
            w.log.write("\n")


def _steps(sigmas: Any) -> int:
    return sigmas.steps if isinstance(sigmas, Sigmas) else 0


@_does("KSampler", "KSamplerAdvanced")
async def _ksampler(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    await _sample(w, run, uid, int(kw.get("steps", 0)))
    return (kw.get("latent_image"),), None


@_does("SamplerCustomAdvanced")
async def _sampler_custom_advanced(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    await _sample(w, run, uid, _steps(kw.get("sigmas")))
    return (kw.get("latent_image"), kw.get("latent_image")), None


@_does("XFuserSamplerCustomAdvanced")
async def _xfuser_sampler(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    await _sample(w, run, uid, _steps(kw.get("sigmas")))
    return (kw.get("latent_image"), kw.get("latent_image"), Token("RAY_ACTORS", uid)), None


@_does("BasicScheduler", "RayBasicScheduler")
async def _scheduler(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    return (Sigmas(int(kw["steps"]) if float(kw.get("denoise", 1.0)) > 0 else 0),), None


@_does("RayInitializer")
async def _ray_initializer(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    if w.switches.log_progress:
        w.log.workers_bar(w.switches.gpus)
    return (Token("RAY_ACTORS_INIT", uid),), None


# -- images, latents, audio and video ----------------------------------------------------------------------


@_does("EmptyImage")
async def _empty_image(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    wd, h, b = int(kw["width"]), int(kw["height"]), int(kw["batch_size"])
    if wd * h * b * 4 > RAM_TOTAL:
        raise NodeFailure(
            "RuntimeError",
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
            f"to allocate {wd * h * b * 4} bytes. Error code 12 (Cannot allocate memory)",
            EXEC_FRAMES
            + [
                f'  File "{ROOT}/nodes.py", line 1877, in generate\n    r = torch.full([batch_size, height, '
                "width, 1], ((color >> 16) & 0xFF) / 0xFF)\n"
            ],
        )
    return (Images(b, wd, h, int(kw.get("color", 0))),), None


@_does("EmptyLatentImage")
async def _empty_latent_image(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    return (Latent(int(kw["batch_size"]), int(kw["width"]), int(kw["height"])),), None


@_does("ImageScale")
async def _image_scale(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    img = kw["image"]
    return (Images(img.n, int(kw["width"]) or img.width, int(kw["height"]) or img.height, img.color),), None


@_does("ImageBlur")
async def _image_blur(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    return (kw["image"],), None  # the same tokens: no pixels here to blur


@_does("RebatchImages")
async def _rebatch_images(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    size = int(kw["batch_size"][0])
    total = sum(i.n for i in kw["images"])
    first = kw["images"][0]
    batches = [Images(min(size, total - s), first.width, first.height, first.color) for s in range(0, total, size)]
    return (batches,), None


@_does("LoadImage")
async def _load_image(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    name, base = w.files.annotated(kw["image"])
    width, height = png_size(base / name)
    return (Images(1, width, height), Token("MASK", uid)), None


@_does("LoadVideo")
async def _load_video(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    return (Video(24, 64, 64, 24.0, Audio(1.0)),), None


@_does("LoadAudio")
async def _load_audio(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    return (Audio(2.0),), None


@_does("GetVideoComponents")
async def _get_video_components(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    v = kw["video"]
    return (Images(v.frames, v.width, v.height), v.audio, float(v.fps)), None


@_does("MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo")
async def _minimax_h3_to_video(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    return (Token("CONDITIONING", uid), Latent(int(kw["length"]), int(kw["width"]), int(kw["height"]))), None


@_does("VAEDecode")
async def _vae_decode(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    lat = kw["samples"]
    return (Images(lat.frames, lat.width, lat.height),), None


@_does("VAEEncode")
async def _vae_encode(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    img = kw["pixels"]
    return (Latent(img.n, img.width, img.height),), None


@_does("VAEDecodeAudio")
async def _vae_decode_audio(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    return (Audio(kw["samples"].frames / 24.0),), None


@_does("CreateVideo")
async def _create_video(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    img = kw["images"]
    return (Video(img.n, img.width, img.height, float(kw["fps"]), kw.get("audio")),), None


# -- output nodes -------------------------------------------------------------------------------------------


@_does("SaveImage")
async def _save_image(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (), save_images(kw["images"], str(kw.get("filename_prefix", "ComfyUI")), w.files.root / "output", "output")


@_does("PreviewImage")
async def _preview_image(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # The node object keeps its random prefix for the life of the process, as ComfyUI's does.
    suffix = w.objects.setdefault((uid, "PreviewImage"), "".join(random.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5)))
    return (), save_images(kw["images"], f"ComfyUI_temp_{suffix}", w.files.root / "temp", "temp")


@_does("SaveAnimatedWEBP")
async def _save_animated_webp(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    folder, filename, counter, subfolder = save_path(str(kw.get("filename_prefix", "ComfyUI")), w.files.root / "output")
    file = f"{filename}_{counter:05}_.webp"
    (folder / file).write_bytes(WEBP)
    return (), {"images": [{"filename": file, "subfolder": subfolder, "type": "output"}], "animated": [True]}


@_does("SaveImageWebsocket")
async def _save_image_websocket(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
    img = kw["images"]
    preview = png_bytes(min(img.width, 64) or 1, min(img.height, 64) or 1, img.color)
    for step in range(img.n):  # this node reports 0..n-1
        await asyncio.sleep(w.switches.step_seconds)
        w.progress(run, uid, step, img.n, preview)
    return (), None


@_does("SaveVideo")
async def _save_video(w: Worker, run: Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    video = kw["video"]
    folder, filename, counter, subfolder = save_path(str(kw.get("filename_prefix", "video/ComfyUI")), w.files.root / "output")
    file = f"{filename}_{counter:05}_.mp4"
    s = w.switches
    await asyncio.to_thread(write_video, folder / file, video, s.video_size, s.max_video_frames)
    return (), {"images": [{"filename": file, "subfolder": subfolder, "type": "output"}], "animated": [True]}
