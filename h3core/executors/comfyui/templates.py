"""Workflows as data: an API-format ComfyUI graph plus a binding spec.

A template says which node input receives each request field (`values`), which fields its graph
has no place for (`ignores`: a demo graph without a model has no prompt), where uploaded
keyframes and references go and what to prune from the graph when a slot is unused (`media`),
which node's progress counts the denoising steps (`sampler`), which output node names the
video (`output`), how many frames the graph makes of the requested count (`frames`: snapped to
MiniMax-H3's 17n + 5, or exactly as asked), and which faster quality levels it runs (`qualities`:
per level, the node inputs set for it, e.g. a cache node's threshold; `exact` is the graph as it
is, and a level it does not map is not served). Templates are checked when they are loaded, so one whose bindings do not
match its graph never reaches a job. The format is documented in docs/operations.md.

Which template serves a mode is chosen by name (`pick`): the settings may name one per mode;
otherwise the built-in `minimax-h3-{mode}-{topology}` serves it. An operator adds one by dropping
a JSON file in a folder and naming it; a file with a built-in's name replaces that built-in.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from h3core.domain.quality import Quality
from h3core.domain.request import UPLOAD_KINDS, GenerationRequest, Mode

Topology = Literal["single-gpu", "raylight"]
ValueField = Literal["prompt", "width", "height", "frames", "seed", "steps"]
VALUE_FIELDS: tuple[ValueField, ...] = ("prompt", "width", "height", "frames", "seed", "steps")
NEEDED_MEDIA: dict[str, tuple[str, ...]] = {
    "t2va": (),
    "fl2va": ("keyframes.first", "keyframes.last"),
    "ref2va": ("references.images",),
}


class TemplateError(ValueError):
    """A template that cannot be used, naming the file and what is wrong."""


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Input(_Data):
    """One input of one graph node, by node id and input name."""

    node: str
    input: str


class Setting(_Data):
    """A value given to one node input (for a quality level)."""

    node: str
    input: str
    value: Any


class Unused(_Data):
    """What to take out of the graph when a slot gets no upload."""

    nodes: tuple[str, ...] = ()
    inputs: tuple[Input, ...] = ()


class Slot(_Data):
    """Where one uploaded file goes in the graph, and what to prune when the request has none for it."""

    set: Input  # receives the uploaded file's name on the ComfyUI server
    unused: Unused = Unused()


class Progress(_Data):
    """Where the template's step progress is read: ComfyUI's websocket, or the server's log."""

    source: Literal["websocket", "log"] = "websocket"
    # For `log`: a regex with two groups, step and total (Raylight's samplers print tqdm bars).
    log_pattern: str = r"(\d+)/(\d+)\s*\["


class Template(_Data):
    """One workflow: an API-format graph and how a request binds to it (the module's docstring has the
    fields); validating one checks its bindings against its graph."""

    name: str
    mode: Mode
    topology: Topology = "single-gpu"
    description: str = ""
    graph: dict[str, dict[str, Any]]
    values: dict[str, tuple[Input, ...]]
    # Request fields the graph has no input for (each field is bound in `values` or named here).
    ignores: tuple[ValueField, ...] = ()
    media: dict[str, tuple[Slot, ...]] = Field(default_factory=dict)
    sampler: str | None = None  # None: no node reports denoising steps (no progress is reported)
    output: str
    progress: Progress = Progress()
    # The frames its video has: "snapped", MiniMax-H3's 17n + 5 (the next one up from the count
    # asked), as the model makes them; "exact": the count asked (a graph without the model).
    frames: Literal["snapped", "exact"] = "snapped"
    # The faster quality levels the graph runs, each as the inputs it sets (`exact`: the graph as is).
    qualities: dict[Quality, tuple[Setting, ...]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bindings_match_graph(self) -> Template:
        problems = check(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def class_types(self) -> set[str]:
        """The node classes the graph uses."""
        return {node["class_type"] for node in self.graph.values()}

    def bound_inputs(self) -> list[tuple[str, str]]:
        """(class_type, input name) of every binding, for checking against a server's nodes."""
        out = []
        for inputs in self.values.values():
            out += [(self.graph[i.node]["class_type"], i.input) for i in inputs]
        for slots in self.media.values():
            for slot in slots:
                out.append((self.graph[slot.set.node]["class_type"], slot.set.input))
        return out

    def missing_on(self, object_info: Mapping[str, Any]) -> list[str]:
        """What this template needs that a server's /object_info does not offer."""
        problems = []
        for cls in sorted(self.class_types()):
            if cls not in object_info:
                problems.append(f"{self.name}: node class {cls} is not installed on the server")
        for cls, name in self.bound_inputs():
            spec = (object_info.get(cls) or {}).get("input") or {}
            known = {*(spec.get("required") or {}), *(spec.get("optional") or {})}
            # Dynamic ("autogrow") inputs are sent as "group.name"; the class lists the group.
            if cls in object_info and name not in known and name.split(".")[0] not in known:
                problems.append(f"{self.name}: {cls} has no input {name!r} on the server")
        return problems

    def value_range(self, object_info: Mapping[str, Any], name: str) -> tuple[int | None, int | None, str]:
        """The range a server's nodes take for request value `name` (every input it is bound to:
        the largest minimum and the smallest maximum), and which inputs set it."""
        low: int | None = None
        high: int | None = None
        where = []
        for i in self.values.get(name, ()):
            cls = self.graph[i.node]["class_type"]
            spec = (object_info.get(cls) or {}).get("input") or {}
            entry = {**(spec.get("optional") or {}), **(spec.get("required") or {})}.get(i.input)
            options = entry[1] if isinstance(entry, list) and len(entry) > 1 and isinstance(entry[1], dict) else {}
            if isinstance(options.get("min"), int):
                low = options["min"] if low is None else max(low, options["min"])
            if isinstance(options.get("max"), int):
                high = options["max"] if high is None else min(high, options["max"])
            if "min" in options or "max" in options:
                where.append(f"{cls}.{i.input}")
        return low, high, ", ".join(where)

    def build(self, request: GenerationRequest, uploaded: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """The graph for one request. `uploaded` maps the request's upload ids to server file names."""
        graph = copy.deepcopy(self.graph)
        values = {
            "prompt": request.prompt,
            "width": request.width,
            "height": request.height,
            "frames": request.frames,
            "seed": request.seed,
            "steps": request.steps,
        }
        for name, inputs in self.values.items():
            for i in inputs:
                graph[i.node]["inputs"][i.input] = values[name]
        if request.quality != "exact" and request.quality not in self.qualities:
            raise TemplateError(f"template {self.name} does not map quality {request.quality}")
        for setting in self.qualities.get(request.quality, ()):
            graph[setting.node]["inputs"][setting.input] = setting.value
        given = request.uploads()
        for name, slots in self.media.items():
            ids = given.get(name, ())
            if len(ids) > len(slots):
                raise TemplateError(f"template {self.name} takes at most {len(slots)} {name}, the request has {len(ids)}")
            for k, slot in enumerate(slots):
                if k < len(ids):
                    graph[slot.set.node]["inputs"][slot.set.input] = uploaded[ids[k]]
                else:
                    for node in slot.unused.nodes:
                        graph.pop(node, None)
                    for i in slot.unused.inputs:
                        if i.node in graph:
                            graph[i.node]["inputs"].pop(i.input, None)
        for name in set(given) - set(self.media):
            raise TemplateError(f"template {self.name} has no place for {name}")
        return graph


def _links(graph: Mapping[str, Mapping[str, Any]]):
    for node_id, node in graph.items():
        for name, value in node.get("inputs", {}).items():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int):
                yield node_id, name, value[0]


def check(t: Template) -> list[str]:
    """Every way the bindings can disagree with the graph."""
    problems = []
    for node_id, entry in t.graph.items():
        if "class_type" not in entry or not isinstance(entry.get("inputs"), dict):
            problems.append(f"graph node {node_id} needs class_type and inputs")
    if problems:
        return problems

    def has(i: Input, what: str) -> None:
        if i.node not in t.graph:
            problems.append(f"{what}: node {i.node} is not in the graph")
        elif i.input not in t.graph[i.node]["inputs"]:
            problems.append(f"{what}: node {i.node} ({t.graph[i.node]['class_type']}) has no input {i.input!r}")

    name: str
    for name in VALUE_FIELDS:
        if not t.values.get(name) and name not in t.ignores:
            problems.append(f"values: no binding for {name!r} (bind it, or name it in ignores)")
        if t.values.get(name) and name in t.ignores:
            problems.append(f"ignores: {name!r} is also bound in values")
    for name in set(t.ignores) & {"width", "height", "frames"}:
        problems.append(f"ignores: {name!r} cannot be ignored (the video's size and length are what a job asks for)")
    for name, inputs in t.values.items():
        if name not in VALUE_FIELDS:
            problems.append(f"values: unknown field {name!r} (known: {list(VALUE_FIELDS)})")
        for i in inputs:
            has(i, f"values.{name}")
    for name, slots in t.media.items():
        if name not in UPLOAD_KINDS:
            problems.append(f"media: unknown field {name!r} (known: {list(UPLOAD_KINDS)})")
        for k, slot in enumerate(slots):
            has(slot.set, f"media.{name}[{k}].set")
            for node in slot.unused.nodes:
                if node not in t.graph:
                    problems.append(f"media.{name}[{k}].unused: node {node} is not in the graph")
            for i in slot.unused.inputs:
                has(i, f"media.{name}[{k}].unused")
    for level, settings in t.qualities.items():
        if level == "exact":
            problems.append("qualities: 'exact' is the graph as it is, not a mapping")
        for k, setting in enumerate(settings):
            has(Input(node=setting.node, input=setting.input), f"qualities.{level}[{k}]")
    for name in NEEDED_MEDIA[t.mode]:
        if not t.media.get(name):
            problems.append(f"media: a {t.mode} template needs slots for {name!r}")
    for what, ref in (("sampler", t.sampler), ("output", t.output)):
        if ref is not None and ref not in t.graph:
            problems.append(f"{what}: node {ref} is not in the graph")
    for src, name, target in _links(t.graph):
        if target not in t.graph:
            problems.append(f"graph: node {src} input {name!r} links to missing node {target}")
    # With every slot unused, nothing may be left pointing at a pruned node.
    pruned = {n for slots in t.media.values() for s in slots for n in s.unused.nodes}
    unlinked = {(i.node, i.input) for slots in t.media.values() for s in slots for i in s.unused.inputs}
    for src, name, target in _links(t.graph):
        if target in pruned and src not in pruned and (src, name) not in unlinked:
            problems.append(f"graph: node {src} input {name!r} would link to pruned node {target}")
    return problems


def load_template(path: Path | str, text: str | None = None) -> Template:
    """The template in `text`, or else in the file at `path`; raises `TemplateError` naming `path` and what
    is wrong."""
    where = str(path)
    try:
        data = json.loads(text if text is not None else Path(path).read_text())
        return Template.model_validate(data)
    except (OSError, json.JSONDecodeError) as exc:
        raise TemplateError(f"{where}: {exc}") from exc
    except ValidationError as exc:
        raise TemplateError(
            f"{where}: " + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'template'}: {e['msg']}" for e in exc.errors())
        ) from exc


def builtin_templates() -> dict[str, Template]:
    """The templates shipped in the `workflows` package, by name."""
    folder = resources.files("h3core.executors.comfyui").joinpath("workflows")
    out = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            t = load_template(f"built-in {entry.name}", entry.read_text())
            out[t.name] = t
    return out


def load_templates(folder: Path | None = None) -> dict[str, Template]:
    """The built-in templates, then any in `folder` (which may replace one by name)."""
    templates = builtin_templates()
    if folder is not None:
        for path in sorted(Path(folder).glob("*.json")):
            t = load_template(path)
            templates[t.name] = t
    return templates


def default_name(mode: str, topology: str) -> str:
    """The built-in template that serves `mode` on `topology` unless the settings name another."""
    return f"minimax-h3-{mode}-{topology}"


def pick(templates: Mapping[str, Template], mode: str, topology: str, named: Mapping[str, str] | None = None) -> Template:
    """The template that serves `mode`: the one `named` gives for it, else the built-in default.
    Only a name chooses: a template that merely matches the mode is never taken in its place."""
    name = (named or {}).get(mode) or default_name(mode, topology)
    t = templates.get(name)
    if t is None:
        raise TemplateError(f"no template named {name!r} for mode {mode!r} (have: {sorted(templates)})")
    if t.mode != mode:
        raise TemplateError(f"template {name!r} is a {t.mode} template, not {mode}")
    if t.topology != topology:
        raise TemplateError(f"template {name!r} is for topology {t.topology}, and ComfyUI runs as {topology}")
    return t
