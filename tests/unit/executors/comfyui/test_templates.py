"""Workflow templates: data that is checked when it is loaded, not when a job runs."""

from __future__ import annotations

import json

import pytest

from h3core.domain.request import GenerationRequest
from h3core.executors.comfyui.templates import TemplateError, builtin_templates, load_template, load_templates, pick
from h3core.testing.comfyui import STOCK_NODES

TEMPLATES = builtin_templates()


def test_a_minimax_template_ships_for_each_mode_and_topology_and_serves_it_unless_another_is_named():
    minimax = {n: t for n, t in TEMPLATES.items() if n.startswith("minimax-h3-")}
    assert {(t.mode, t.topology) for t in minimax.values()} == {
        (m, t) for m in ("t2va", "fl2va", "ref2va") for t in ("single-gpu", "raylight")
    }
    for t in minimax.values():
        assert pick(TEMPLATES, t.mode, t.topology) is t
    assert pick(TEMPLATES, "t2va", "single-gpu", {"t2va": "core-nodes-t2va"}).name == "core-nodes-t2va"
    assert pick(TEMPLATES, "fl2va", "single-gpu", {"t2va": "core-nodes-t2va"}).name == "minimax-h3-fl2va-single-gpu"


def test_an_added_template_for_a_mode_is_used_when_named_and_never_otherwise(tmp_path):
    data = _data()
    data["name"] = "house-t2va"
    (tmp_path / "house.json").write_text(json.dumps(data))
    templates = load_templates(tmp_path)
    assert pick(templates, "t2va", "single-gpu").name == "minimax-h3-t2va-single-gpu"  # the built-in still
    assert pick(templates, "t2va", "single-gpu", {"t2va": "house-t2va"}) == templates["house-t2va"]


@pytest.mark.parametrize(
    ("named", "mode", "topology", "message"),
    [
        ({"t2va": "nope"}, "t2va", "single-gpu", "no template named 'nope' for mode 't2va'"),
        ({"fl2va": "core-nodes-t2va"}, "fl2va", "single-gpu", "'core-nodes-t2va' is a t2va template, not fl2va"),
        (
            {"t2va": "core-nodes-t2va"},
            "t2va",
            "raylight",
            "'core-nodes-t2va' is for topology single-gpu, and ComfyUI runs as raylight",
        ),
    ],
)
def test_a_named_template_that_cannot_serve_the_mode_is_refused_naming_why(named, mode, topology, message):
    with pytest.raises(TemplateError, match=message):
        pick(TEMPLATES, mode, topology, named)


def test_the_model_free_template_uses_core_nodes_only_and_binds_the_videos_size_and_length():
    t = TEMPLATES["core-nodes-t2va"]
    assert t.missing_on(STOCK_NODES) == [], "every node is one a stock ComfyUI has"
    assert t.class_types() == {"EmptyImage", "ImageBlur", "CreateVideo", "SaveVideo"} and t.sampler is None
    graph = t.build(GenerationRequest(prompt="a fox", width=320, height=192, frames=29, seed=5, steps=4), {})
    assert graph["1"]["inputs"] | {"color": 0} == {"width": 320, "height": 192, "batch_size": 29, "color": 0}
    assert "a fox" not in json.dumps(graph) and set(t.ignores) == {"prompt", "seed", "steps"}
    assert t.value_range(STOCK_NODES, "frames")[:2] == (1, 4096)  # EmptyImage.batch_size: the frame window


def test_request_values_land_on_their_bound_inputs():
    t = TEMPLATES["minimax-h3-t2va-single-gpu"]
    graph = t.build(GenerationRequest(prompt="a fox", width=832, height=480, frames=300, seed=7, steps=30), {})
    node = graph["5"]["inputs"]
    assert (node["prompt"], node["width"], node["height"], node["length"]) == ("a fox", 832, 480, 300)
    assert graph["6"]["inputs"]["noise_seed"] == 7 and graph["9"]["inputs"]["steps"] == 30
    assert (
        TEMPLATES["minimax-h3-t2va-raylight"].build(GenerationRequest(prompt="p", seed=9), {})["10"]["inputs"]["noise_seed"] == 9
    )


def test_unused_slots_are_pruned_with_the_inputs_that_pointed_at_them():
    t = TEMPLATES["minimax-h3-ref2va-single-gpu"]
    req = GenerationRequest(prompt="p", mode="ref2va", references={"images": ["a", "b"], "audios": ["c"]})
    graph = t.build(req, {"a": "a.png", "b": "b.png", "c": "c.wav"})
    node = graph["5"]["inputs"]
    assert node["ref_images.ref_image_0"] == ["30", 0] and node["ref_images.ref_image_1"] == ["31", 0]
    assert "ref_images.ref_image_2" not in node and "32" not in graph
    assert not any(k.startswith("ref_videos") for k in node) and "400" not in graph
    assert graph["30"]["inputs"]["image"] == "a.png" and graph["50"]["inputs"]["audio"] == "c.wav"
    # No link is left dangling.
    for n in graph.values():
        for v in n["inputs"].values():
            if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int):
                assert v[0] in graph


def test_fl2va_with_only_a_last_frame_drops_the_first_frame_input():
    t = TEMPLATES["minimax-h3-fl2va-single-gpu"]
    graph = t.build(GenerationRequest(prompt="p", mode="fl2va", keyframes={"last": "z"}), {"z": "z.png"})
    assert "first_frame" not in graph["5"]["inputs"] and "20" not in graph
    assert graph["21"]["inputs"]["image"] == "z.png"


def test_more_references_than_slots_is_refused_clearly():
    t = TEMPLATES["minimax-h3-ref2va-single-gpu"].model_copy(
        update={
            "media": {
                **TEMPLATES["minimax-h3-ref2va-single-gpu"].media,
                "references.images": TEMPLATES["minimax-h3-ref2va-single-gpu"].media["references.images"][:2],
            }
        }
    )
    with pytest.raises(TemplateError, match="at most 2 references.images"):
        t.build(
            GenerationRequest(prompt="p", mode="ref2va", references={"images": ["a", "b", "c"]}), {"a": "a", "b": "b", "c": "c"}
        )


def _data(name="minimax-h3-t2va-single-gpu"):
    return json.loads(TEMPLATES[name].model_dump_json())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["values"]["prompt"][0].update(node="99"), "values.prompt: node 99 is not in the graph"),
        (lambda d: d["values"]["frames"][0].update(input="frames"), "has no input 'frames'"),
        (lambda d: d["values"].pop("seed"), "no binding for 'seed' \\(bind it, or name it in ignores\\)"),
        (lambda d: d.update(ignores=["steps"]), "ignores: 'steps' is also bound in values"),
        (lambda d: (d["values"].pop("frames"), d.update(ignores=["frames"])), "'frames' cannot be ignored"),
        (lambda d: d.update(sampler="77"), "sampler: node 77"),
        (lambda d: d["graph"]["11"]["inputs"].update(samples=["42", 0]), "links to missing node 42"),
    ],
)
def test_a_template_whose_bindings_do_not_match_its_graph_is_refused_at_load(tmp_path, mutate, message):
    data = _data()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TemplateError, match=message) as err:
        load_template(path)
    assert "bad.json" in str(err.value)


def test_a_pruned_slot_must_take_its_links_with_it(tmp_path):
    data = _data("minimax-h3-fl2va-single-gpu")
    data["media"]["keyframes.first"][0]["unused"]["inputs"] = []
    (tmp_path / "x.json").write_text(json.dumps(data))
    with pytest.raises(TemplateError, match="would link to pruned node 20"):
        load_template(tmp_path / "x.json")


def test_an_operator_adds_or_replaces_a_template_without_code(tmp_path):
    data = _data()
    data["name"] = "house-t2va"
    data["graph"]["8"]["inputs"]["sampler_name"] = "euler"
    (tmp_path / "house.json").write_text(json.dumps(data))
    data = _data("minimax-h3-fl2va-single-gpu")
    data["graph"]["8"]["inputs"]["sampler_name"] = "euler"
    (tmp_path / "fl2va.json").write_text(json.dumps(data))
    templates = load_templates(tmp_path)
    assert templates.keys() == TEMPLATES.keys() | {"house-t2va"}
    # A file with a built-in's name replaces it, and serves its mode as the built-in did.
    assert pick(templates, "fl2va", "single-gpu").graph["8"]["inputs"]["sampler_name"] == "euler"


def test_a_graph_that_makes_the_frames_asked_says_so_and_its_jobs_are_not_warned_of_a_snap(tmp_path):
    from h3core.adapters.artifacts import LocalArtifactStore
    from h3core.domain.admission import AdmissionRules
    from h3core.domain.request import GenerationRequest
    from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings

    def caps(**templates):
        settings = ComfyUISettings(url="http://comfyui.test", client_id="t", templates=templates)
        return ComfyUIExecutor(settings, TEMPLATES, LocalArtifactStore(tmp_path), lambda u: tmp_path / u).capabilities()

    assert TEMPLATES["core-nodes-t2va"].frames == "exact" and TEMPLATES["minimax-h3-t2va-single-gpu"].frames == "snapped"
    asked = GenerationRequest(prompt="p", width=448, height=256, frames=48)
    demo, model = caps(t2va="core-nodes-t2va"), caps()
    assert demo.exact_frames == ("t2va",) and model.exact_frames == ()
    assert AdmissionRules(demo).decide(asked).frames == 48 and asked.warnings(48) == ()
    assert AdmissionRules(model).decide(asked).frames == 56
    assert asked.warnings(56) == ("48 frames snapped to 56: MiniMax-H3 makes 17n+5",)


def test_a_template_runs_exact_only_unless_it_maps_a_level_to_the_inputs_it_sets():
    plain = TEMPLATES["minimax-h3-t2va-single-gpu"]
    assert plain.qualities == {}
    with pytest.raises(TemplateError, match="does not map quality fast"):
        plain.build(GenerationRequest(prompt="p", quality="fast"), {})
    data = _data()
    data["qualities"] = {"fast": [{"node": "9", "input": "steps", "value": 12}]}  # a stand-in for a cache node's input
    mapped = load_template("fast.json", json.dumps(data))
    assert mapped.build(GenerationRequest(prompt="p", steps=30, quality="fast"), {})["9"]["inputs"]["steps"] == 12
    assert mapped.build(GenerationRequest(prompt="p", steps=30), {})["9"]["inputs"]["steps"] == 30  # exact: as is
    data["qualities"] = {"balanced": [{"node": "99", "input": "x", "value": 1}], "exact": []}
    with pytest.raises(TemplateError) as refused:
        load_template("bad.json", json.dumps(data))
    assert "qualities.balanced[0]: node 99 is not in the graph" in str(refused.value)
    assert "'exact' is the graph as it is" in str(refused.value)


def test_the_executor_states_the_levels_every_template_in_service_maps(tmp_path):
    from h3core.adapters.artifacts import LocalArtifactStore
    from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings

    def executor(templates):
        settings = ComfyUISettings(url="http://comfyui.test", client_id="t")
        return ComfyUIExecutor(settings, templates, LocalArtifactStore(tmp_path / "a"), lambda u: tmp_path / u)

    assert executor(TEMPLATES).capabilities().qualities == ("exact",)
    mapped = dict(TEMPLATES)
    for name in ("minimax-h3-t2va-single-gpu", "minimax-h3-fl2va-single-gpu", "minimax-h3-ref2va-single-gpu"):
        data = _data(name)
        sampler = next(i for i in TEMPLATES[name].values["steps"])
        data["qualities"] = {"fast": [{"node": sampler.node, "input": sampler.input, "value": 12}]}
        if name != "minimax-h3-ref2va-single-gpu":  # one mode without `balanced`: not stated
            data["qualities"]["balanced"] = data["qualities"]["fast"]
        mapped[name] = load_template(f"{name}.json", json.dumps(data))
    assert executor(mapped).capabilities().qualities == ("exact", "fast")


def test_the_executor_makes_a_long_video_as_segments_only_where_it_serves_fl2va(tmp_path):
    """fl2va continues each segment from the frame the one before kept last: without its template, or
    on a server lacking its nodes, a request past the window is refused naming why."""
    import copy

    from h3core.adapters.artifacts import LocalArtifactStore
    from h3core.domain.admission import AdmissionRules
    from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings
    from h3core.testing.comfyui import NODE_INFO

    info = copy.deepcopy(NODE_INFO)
    for cls in ("MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo"):
        info[cls]["input"]["required"]["length"][1]["max"] = 48  # the server's window: 2 s

    def caps(templates, lacking=()):
        settings = ComfyUISettings(url="http://comfyui.test", client_id="t")
        executor = ComfyUIExecutor(settings, templates, LocalArtifactStore(tmp_path / "a"), lambda u: tmp_path / u)
        executor._info = {cls: node for cls, node in info.items() if cls not in lacking}  # as last read from the server
        return executor.capabilities()

    long = GenerationRequest(prompt="p", width=448, height=256, frames=120)
    served = caps(TEMPLATES)
    assert served.continues_segments and served.window is not None and served.window.max_frames == 48
    assert len(AdmissionRules(served).decide(long).plan.segments) == 3
    without = {name: t for name, t in TEMPLATES.items() if t.mode != "fl2va"}
    for refusing in (caps(without), caps(TEMPLATES, lacking={"LoadImage"})):
        refused = AdmissionRules(refusing).decide(long)
        assert not refusing.continues_segments and not refused.admitted and refused.reason == "model_window"
        assert "comfyui does not make a longer video as segments" in refused.detail
