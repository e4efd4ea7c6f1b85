"""The bundled wheels on the machine's own python (run with it, before the bundle is on PYTHONPATH;
the standard library, and `packaging` or pip's copy of it where there is one, so it runs on a bare
interpreter).

    python wheels.py check FOLDER            # this python against the bundle's manifest.json; exit 3 on a mismatch
    python wheels.py select FOLDER LISTING   # which wheels to install: one line each, the paths to LISTING
    python wheels.py needs FOLDER IMAGE      # here, after bundling: what h3core needs, against the bundle and
                                             # the GPU image's package list (IMAGE); exit 4 when one is missing

`check` reads the interpreter's version and platform tag first and stops, naming both, when the
bundle (gpu_bundle.sh records what it was made for in manifest.json) was made for another.

`select`: a wheel is installed only where this interpreter can use it (its tags); a GROUP (a
package and the compiled core it needs, e.g. pydantic and pydantic-core) is installed whole or
not at all, so a working copy on the machine is never shadowed by half a pair. CORE wheels (what
the project pins and its suite tests) are always installed; every other wheel only where the
machine lacks that distribution or has an older one, so nothing the machine's torch uses is
shadowed by an older copy. Then it follows what h3core needs (pyproject's core and pipeline
requirements, sageattention, and what each installed wheel requires in turn) through the bundle
and the machine: a distribution on neither stops the step (exit 4), named, before a later step
fails on an ImportError; one there at a version a pin refuses is a warning (step 1b stops the
check if it does not import).

`needs` does the same here when the bundle is made, against the image's package list; there a
refused version stops it too, and versions the list does not give are taken as they come.
"""

from __future__ import annotations

import json
import platform
import re
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

MANIFEST = "manifest.json"
CORE = {
    "diffusers",
    "transformers",  # the image's 5.17 is below what pyproject declares and the suite tests
    "huggingface-hub",
    "sageattention",
    "pydantic",
    "pydantic-core",
    "sqlite-utils",
    "sqlite-fts4",
    "click-default-group",
    "av",
}
# Installed together or not at all: the pure-Python half must not shadow the machine's working copy
# when this interpreter cannot take the compiled half.
GROUPS = (
    frozenset({"pydantic", "pydantic-core", "annotated-types", "typing-inspection"}),
    frozenset({"transformers", "tokenizers", "safetensors", "huggingface-hub", "httpx2"}),
)


# Declared but never imported by what the check runs: a missing or old copy is noted, not a stop.
UNUSED = {
    "hf-xet": "huggingface-hub imports it only to download, and the check runs offline",
    "importlib-metadata": "diffusers imports the standard library's importlib.metadata on Python 3.8 and later",
}
# What the check runs of h3core: its core and the pipeline extra (pyproject.toml), and sageattention.
EXTRAS = ("pipeline",)
ALSO = ("sageattention",)
UNKNOWN = "?"  # an image package whose version the list does not give


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dist(whl: Path) -> tuple[str, str]:
    """A wheel's distribution name (normalised) and version, from its file name."""
    name, version = whl.name.split("-")[:2]
    return norm(name), version


def pinned(wheels) -> dict[str, tuple[str, Path]]:
    """Each wheel by its distribution: (version, wheel)."""
    return {name: (version, whl) for whl in wheels for name, version in [dist(whl)]}


def version_key(v: str):
    try:
        from packaging.version import Version

        return (0, Version(v))
    except Exception:  # noqa: BLE001 - no packaging, or a version it cannot parse: the leading numbers
        return (1, tuple(int(x) for x in re.findall(r"\d+", v)[:4]))


def interpreter() -> dict[str, str]:
    """What this python is, as wheel tags name it."""
    impl = {"cpython": "cp"}.get(sys.implementation.name, sys.implementation.name)
    return {
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "full": platform.python_version(),
        "tag": f"{impl}{sys.version_info[0]}{sys.version_info[1]}",
        "platform": sysconfig.get_platform().replace("-", "_").replace(".", "_"),  # linux_x86_64
        "machine": platform.machine(),
        "implementation": impl,
    }


def supported_tags() -> set[str]:
    """Every python-abi-platform triple this interpreter takes (pip's own list where pip is here)."""
    for module in ("packaging.tags", "pip._vendor.packaging.tags"):
        try:
            tags = __import__(module, fromlist=["sys_tags"])
            return {str(t) for t in tags.sys_tags()}
        except Exception:  # noqa: BLE001 - neither importable: the fallback below
            continue
    return fallback_tags(interpreter(), glibc())


def glibc() -> tuple[int, int] | None:
    lib, version = platform.libc_ver()
    if lib != "glibc" or not version:
        return None
    major, minor = (int(x) for x in version.split(".")[:2])
    return major, minor


def fallback_tags(me: dict[str, str], libc: tuple[int, int] | None) -> set[str]:
    """The tags of a CPython on manylinux without `packaging`: its own ABI, abi3 down to 3.2, pure Python."""
    arch = me["machine"]
    plats = {f"linux_{arch}"}
    if libc:
        plats |= {f"manylinux_{libc[0]}_{m}_{arch}" for m in range(0, libc[1] + 1)}
        legacy = {(2, 5): "manylinux1", (2, 12): "manylinux2010", (2, 17): "manylinux2014"}
        plats |= {f"{name}_{arch}" for (ma, mi), name in legacy.items() if (ma, mi) <= libc}
    major, minor = (int(x) for x in me["python"].split("."))
    out = {f"{me['tag']}-{me['tag']}-{p}" for p in plats} | {f"{me['tag']}-none-{p}" for p in plats}
    out |= {f"cp3{m}-abi3-{p}" for m in range(2, minor + 1) for p in plats}
    out |= {f"{py}-none-any" for py in ("py3", f"py{major}{minor}", me["tag"], "py2.py3")}
    return out


def wheel_tags(filename: str) -> set[str]:
    """A wheel's tag triples (compressed sets expanded), from its file name."""
    parts = filename[: -len(".whl")].split("-")
    py, abi, plat = parts[-3:]
    return {f"{p}-{a}-{q}" for p in py.split(".") for a in abi.split(".") for q in plat.split(".")}


def check(folder: Path) -> int:
    me = interpreter()
    print(f"python: {sys.executable}: {me['implementation']} {me['full']} ({me['tag']}, {me['platform']})")
    path = folder / MANIFEST
    if not path.exists():
        print(f"no {MANIFEST} in {folder}: the bundle's target is unknown; each wheel is matched to this python by its tags")
        return 0
    made = json.loads(path.read_text())
    pythons, arch = made.get("pythons", []), made.get("machine", "x86_64")
    if me["python"] in pythons and me["implementation"] == made.get("implementation", "cp") and me["machine"] == arch:
        print(
            f"the bundle in {folder} was made for {made.get('implementation', 'cp')} {', '.join(pythons)} on {arch}: it matches"
        )
        return 0
    print(
        f"STOP: the bundle in {folder} was made for {made.get('implementation', 'cp')} {', '.join(pythons) or '?'} "
        f"(manylinux {arch}); this machine's python is {me['implementation']} {me['full']} ({me['tag']}, {me['platform']}). "
        f"Make it again for this one: H3GPU_PYVER={me['python']} bash bench/gpu_bundle.sh"
    )
    return 3


def select(folder: Path, tags: set[str], have: dict[str, str | None]) -> list[tuple[Path, bool, str]]:
    """(wheel, install?, why) for each bundled wheel; `have` maps a distribution to the machine's version."""
    by_name: dict[str, list[Path]] = {}
    for whl in sorted(folder.glob("*.whl")):
        by_name.setdefault(dist(whl)[0], []).append(whl)
    usable = {name: next((w for w in ws if wheel_tags(w.name) & tags), None) for name, ws in by_name.items()}
    blocked: dict[str, str] = {}
    for group in GROUPS:
        bad = sorted(n for n in group if n in usable and usable[n] is None)
        for n in group & usable.keys():
            if bad:
                blocked[n] = f"no {'/'.join(bad)} wheel for this python: the whole group is left out, the machine's copy kept"
    out = []
    for name, wheels in sorted(by_name.items()):
        whl = usable[name] or wheels[0]
        version, mine = dist(whl)[1], have.get(name)
        if usable[name] is None:
            take, why = False, f"no wheel for this python ({', '.join(w.name.split('-', 2)[2] for w in wheels)})"
        elif name in blocked:
            take, why = False, blocked[name]
        elif name in CORE:
            take, why = True, "core" + (f" (the machine's {mine} is shadowed)" if mine else "")
        elif mine is None:
            take, why = True, "missing here"
        elif version_key(mine) < version_key(version):
            take, why = True, f"the machine has older {mine}"
        else:
            take, why = False, f"the machine has {mine}: kept"
        out.append((whl, take, why))
    return out


def requires(whl: Path) -> list[str]:
    """A wheel's Requires-Dist lines, from its METADATA ([] where it has none or is no zip)."""
    try:
        with zipfile.ZipFile(whl) as z:
            name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
            text = z.read(name).decode("utf-8", "replace") if name else ""
    except (zipfile.BadZipFile, OSError):
        return []
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def roots(pyproject: Path) -> list[str]:
    """What the check imports of h3core needs: the core requirements, the `EXTRAS`' and `ALSO`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in EXTRAS:
        wanted += [r for r in project["optional-dependencies"][extra] if not norm(r).startswith("h3core")]
    return wanted + list(ALSO)


def _packaging():
    for prefix in ("packaging", "pip._vendor.packaging"):
        try:
            req = __import__(f"{prefix}.requirements", fromlist=["Requirement"])
            markers = __import__(f"{prefix}.markers", fromlist=["default_environment"])
            return req.Requirement, markers.default_environment
        except ImportError:
            continue
    return None


def unmet(
    wanted: list[str],
    bundled: dict[str, tuple[str, Path]],
    machine: Callable[[str], str | None],
    environment: dict[str, str] | None = None,
    *,
    strict: bool = True,
) -> tuple[list[str], list[str]]:
    """(problems, notes): each requirement reachable from `wanted` that neither the wheels to be
    installed (`bundled`: name -> (version, wheel)) nor the machine (`machine(name)`: its version,
    `UNKNOWN`, or None) satisfies. A bundled wheel's own requirements are followed in turn; the
    machine's packages are taken with theirs. `UNUSED` ones go to the notes, and so do versions a
    requirement refuses unless `strict`: on a lent device a distribution that is there, at a
    version outside a pin's range, is more often fine than not (an import that fails stops step
    1b), while a missing one fails every step for sure."""
    found = _packaging()
    if found is None:
        return [], ["no packaging module here: the requirements were not followed"]
    Requirement, default_environment = found
    env = {**default_environment(), **(environment or {}), "extra": ""}
    problems: list[str] = []
    notes: list[str] = []
    todo = [(line, "h3core") for line in wanted]
    seen: set[str] = set()
    while todo:
        line, who = todo.pop(0)
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = norm(req.name)
        spec = str(req.specifier)
        if name in bundled:
            version, whl = bundled[name]
            where = "the bundle has"
            if name not in seen:
                seen.add(name)
                todo += [(r, f"{name} {version}") for r in requires(whl)]
        else:
            version, where = machine(name), "this machine has"
        if version is None:
            why = f"{who} needs {name}{spec}: neither the bundle nor this machine has it"
        elif version == UNKNOWN or not spec or req.specifier.contains(version, prereleases=True):
            continue
        else:
            why = f"{who} needs {name}{spec}; {where} {version}"
        if name in UNUSED:
            notes.append(f"{why} ({UNUSED[name]})")
        elif version is not None and not strict:
            notes.append(f"WARNING: {why}: the check goes on with it")
        else:
            problems.append(why)
    return problems, notes


def image_list(path: Path) -> dict[str, str]:
    """The GPU image's packages (one per line, `name` or `name==version`, `#` comments)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[norm(name)] = version.strip() or UNKNOWN
    return out


def target_environment(folder: Path) -> dict[str, str]:
    """The markers' environment of the python the bundle was made for (its manifest's first)."""
    path = folder / MANIFEST
    pythons = json.loads(path.read_text()).get("pythons", []) if path.exists() else []
    if not pythons:
        return {}
    return {
        "python_version": pythons[0],
        "python_full_version": f"{pythons[0]}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
    }


def report(problems: list[str], notes: list[str]) -> int:
    for note in notes:
        print(f"  note: {note}")
    for problem in problems:
        print(f"  MISSING: {problem}")
    if problems:
        print(f"STOP: {len(problems)} requirement(s) of what the check runs are not met (above): add them to bench/gpu_bundle.sh")
        return 4
    print("every requirement of what the check runs is met")
    return 0


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        return check(Path(argv[1]))
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if argv[:1] == ["needs"]:
        folder, image = Path(argv[1]), image_list(Path(argv[2]))
        bundled = pinned(sorted(folder.glob("*.whl")))
        print(f"what the check runs needs, against {folder} and the image's list {argv[2]}:")
        return report(*unmet(roots(pyproject) + sorted(bundled), bundled, image.get, target_environment(folder)))
    if argv[:1] == ["select"]:
        argv = argv[1:]
    folder, listing = Path(argv[0]), Path(argv[1])
    names = {dist(w)[0] for w in folder.glob("*.whl")}
    rows = select(folder, supported_tags(), {n: installed(n) for n in names})
    for whl, take, why in rows:
        print(f"  {'install' if take else 'skip   '} {' '.join(dist(whl))}: {why}")
    listing.write_text("".join(f"{whl}\n" for whl, take, _ in rows if take))
    taken = pinned(w for w, take, _ in rows if take)
    return report(*unmet(roots(pyproject) + sorted(taken), taken, installed, strict=False))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
