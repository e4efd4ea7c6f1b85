"""What is admitted is what runs, for every executor kind: a request the admission contract
admits passes that executor's own pre-check, and one the pre-check refuses is refused at submit.

Each executor is judged by the real thing where it can be had here: the fake by its own limits,
the pipeline by its pre-check and then by diffusers itself (the job is run up to its first
denoising step on the tiny model), groups by their budgets, ComfyUI by its templates and then by
the (protocol-faithful) server's own prompt validation.
"""

from __future__ import annotations

import wave
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3core import AdmissionRules, Admit, FakeExecutor, FakeLimits, LocalAdmission, LocalArtifactStore
from h3core.domain.geometry import count_tokens
from h3core.domain.request import GenerationRequest
from h3core.executors.base import ExecutorFailure, JobSpec
from tests.factories import png
from tests.profiles import examples

# Each pipeline example runs diffusers up to its first step; the others are checks in memory.
SLOW = settings(max_examples=examples(12), suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FAST = settings(max_examples=examples(50), suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

small_sides = st.integers(1, 4).map(lambda n: n * 32)


@st.composite
def requests(draw, sides=small_sides, frames=st.integers(1, 800)):
    mode = draw(st.sampled_from(["t2va", "fl2va", "ref2va"]))
    kw = {"prompt": "a fox", "width": draw(sides), "height": draw(sides), "frames": draw(frames), "steps": 2}
    if mode == "fl2va":
        first, last = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
        kw["keyframes"] = {k: f"key{k}" for k, on in (("first", first), ("last", last)) if on}
    elif mode == "ref2va":
        refs = {
            "images": [f"img{i}" for i in range(draw(st.integers(0, 9)))],
            "videos": [f"vid{i}" for i in range(draw(st.integers(0, 3)))],
            "audios": [f"aud{i}" for i in range(draw(st.integers(0, 3)))],
        }
        if not any(refs.values()):
            refs["images"] = ["img0"]
        kw["references"] = {k: v for k, v in refs.items() if v}
    return GenerationRequest(mode=mode, **kw)


def spec(request: GenerationRequest) -> JobSpec:
    return JobSpec("j" * 32, 1, request, count_tokens(request).total)


def passes(check, request: GenerationRequest) -> bool:
    try:
        check(request)
    except ExecutorFailure as exc:
        assert exc.kind == "invalid", exc
        return False
    return True


def agree(contract: LocalAdmission, check, request: GenerationRequest) -> None:
    """Admitted iff the check passes every call the job makes: the request, or each segment's call
    where admission planned it as segments."""
    decision = contract.decide(request)
    calls = [request]
    if isinstance(decision, Admit) and decision.plan is not None:
        calls = [AdmissionRules.segment_request(request, decision.plan, s) for s in decision.plan.segments]
    assert decision.admitted == all(passes(check, c) for c in calls), (request, decision)


# -- the fake, with limits of its own -----------------------------------------------------------


@FAST
@given(
    st.builds(
        FakeLimits,
        modes=st.lists(st.sampled_from(["t2va", "fl2va", "ref2va"]), min_size=1, unique=True).map(tuple),
        min_seconds=st.sampled_from([0.0, 2.0, 5.0]),
        max_seconds=st.one_of(st.none(), st.sampled_from([5.0, 15.0, 30.0])),
        budget_tokens=st.one_of(st.none(), st.integers(500, 20_000)),
        media=st.dictionaries(st.sampled_from(["keyframes.last", "references.images", "references.videos"]), st.integers(0, 3)),
    ),
    requests(sides=st.integers(1, 24).map(lambda n: n * 32)),
)
def test_the_fake_executor(tmp_path, limits, request):
    fake = FakeExecutor(LocalArtifactStore(tmp_path / "a"), limits=limits)
    agree(LocalAdmission(fake.capabilities), lambda r: fake.check(spec(r)), request)


# -- the in-process pipeline, by its model's facts and by diffusers itself ------------------------


@pytest.fixture(scope="module")
def pipeline(tiny_model, tmp_path_factory):
    from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings
    from h3core.executors.pipeline.generate import Generator
    from h3core.executors.pipeline.model import load_model

    media = tmp_path_factory.mktemp("media")
    for name in ("keyfirst", "keylast", *(f"img{i}" for i in range(9))):
        (media / f"{name}.png").write_bytes(png(64, 48))
    for i in range(3):
        _wav(media / f"aud{i}.wav")
    executor = PipelineExecutor(PipelineSettings(model_dir=tiny_model), LocalArtifactStore(media / "a"), lambda u: media / u)
    generator = Generator(load_model(tiny_model), executor.plan)  # the kernel the executor decided
    return executor, generator, media


def _wav(path: Path, seconds: float = 1.0, rate: int = 32_000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(4 * int(seconds * rate)))


def _diffusers_accepts(executor, generator, media_dir: Path, request: GenerationRequest) -> None:
    """The executor's pre-check, then the job itself up to its first denoising step: diffusers'
    own checks (the clip window, the references) all run before it."""
    from h3core.executors.pipeline.generate import Control, Media, StopRequested

    executor.check(spec(request))
    r = request
    files = Media(
        first=media_dir / "keyfirst.png" if r.keyframes and r.keyframes.first else None,
        last=media_dir / "keylast.png" if r.keyframes and r.keyframes.last else None,
        images=tuple(media_dir / f"{i}.png" for i in (r.references.images if r.references else ())),
        audios=tuple(media_dir / f"{i}.wav" for i in (r.references.audios if r.references else ())),
    )
    control = Control()
    control.on_step = lambda step, total: control.stop.set()

    def on_stage(name: str) -> None:
        # diffusers' ref2va checks (counts, pairing, the window) all run in before_encode; what
        # follows encodes each reference at a 2048-pixel edge, minutes on a CPU.
        if r.mode == "ref2va" and name == "text_encoder":
            raise StopRequested

    control.on_stage = on_stage
    try:
        generator.run(request, files, control)
    except StopRequested:
        return


@SLOW
@given(requests(frames=st.one_of(st.integers(1, 30), st.integers(330, 370), st.integers(1, 800))))
def test_the_pipeline_executor_and_diffusers_itself(pipeline, request):
    executor, generator, media = pipeline
    agree(LocalAdmission(executor.capabilities), lambda r: _diffusers_accepts(executor, generator, media, r), request)


# -- groups of devices, by their budgets ----------------------------------------------------------


@pytest.fixture(scope="module")
def probe_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("probe") / "h3-attention-cache.json"


@FAST
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
    st.dictionaries(st.integers(1, 3), st.integers(1_000, 30_000)),
    requests(sides=st.integers(1, 24).map(lambda n: n * 32)),
)
def test_groups_of_devices(tiny_model, probe_cache, tmp_path, sizes, budgets, request):
    pytest.importorskip("ray", reason="the distributed extra is not installed")
    from h3core.domain.topology import Topology
    from h3core.executors.distributed import DistributedExecutor, DistributedSettings

    topology = Topology(devices=sum(sizes), group_sizes=tuple(sizes))
    executor = DistributedExecutor(
        # The kernel probe's own cache, as `serve` keeps it: measured by the first example only.
        DistributedSettings(model_dir=tiny_model, topology=topology, budgets=budgets, attention_cache=probe_cache),
        LocalArtifactStore(tmp_path / "a"),
        lambda u: tmp_path / u,
    )
    agree(LocalAdmission(executor.capabilities), lambda r: executor.check(spec(r)), request)


# -- ComfyUI, by its templates and by the server's own prompt validation --------------------------


@pytest.fixture(scope="module")
def comfyui(tmp_path_factory):
    from h3core.testing.comfyui import NODE_INFO, FakeComfyUI

    root = tmp_path_factory.mktemp("comfyui")
    server = FakeComfyUI(root)  # not started: its prompt validation is all that is used
    (root / "input").mkdir(parents=True, exist_ok=True)
    return server, root, NODE_INFO


@FAST
@given(
    st.sampled_from(["single-gpu", "raylight"]),
    st.sets(st.sampled_from(["t2va", "fl2va", "ref2va"])),
    st.sets(st.sampled_from(["LoadImage", "LoadAudio", "LoadVideo", "MiniMaxH3ReferenceToVideo"])),
    requests(sides=st.integers(1, 24).map(lambda n: n * 32), frames=st.integers(1, 1300)),
    st.sampled_from([{}, {"t2va": "core-nodes-t2va"}]),  # the built-ins, or the model-free graph named for t2va
)
def test_comfyui_with_a_template_set(comfyui, tmp_path, topology, dropped, missing, request, named):
    from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings
    from h3core.executors.comfyui.templates import builtin_templates

    server, root, node_info = comfyui
    templates = {n: t for n, t in builtin_templates().items() if t.mode not in dropped}
    named = named if topology == "single-gpu" else {}
    executor = ComfyUIExecutor(
        ComfyUISettings(url="http://127.0.0.1:9", client_id="t", topology=topology, templates=named),
        templates,
        LocalArtifactStore(tmp_path / "a"),
        lambda u: tmp_path / u,
    )
    executor._info = {name: info for name, info in _object_info(server, node_info).items() if name not in missing}
    server.missing_nodes = set(missing)

    def check(r: GenerationRequest) -> None:
        executor.check(spec(r))
        names = {}
        for ids in r.uploads().values():
            for upload_id in ids:
                names[upload_id] = (
                    f"h3-{upload_id}.{'wav' if upload_id.startswith('aud') else 'mp4' if upload_id.startswith('vid') else 'png'}"
                )
                (root / "input" / names[upload_id]).touch()
        graph = executor._template(spec(r)).build(r, names)
        ok, error, _, node_errors = server._validate_prompt(graph, None)
        if not ok:
            raise ExecutorFailure("invalid", f"ComfyUI refused the graph: {error} {node_errors}")

    contract = LocalAdmission(executor.capabilities)
    decision = contract.decide(request)
    if decision.admitted or decision.reason in ("mode_unavailable", "model_window"):
        agree(contract, check, request)
    else:  # refused for memory or the API's cap: ComfyUI itself would take it, and run out of memory
        assert decision.reason in ("vram", "unverified", "api_limit", "quality"), decision


def _object_info(server, node_info) -> dict:
    return {name: server._info(name) for name in node_info}
