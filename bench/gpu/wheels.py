"""The bundled wheels on the machine's own python (run with it, before the bundle is on PYTHONPATH;
stdlib only, so it runs on a bare interpreter).

    python wheels.py check FOLDER            # this python against the bundle's manifest.json; exit 3 on a mismatch
    python wheels.py select FOLDER LISTING   # which wheels to install: one line each, the paths to LISTING

`check` reads the interpreter's version and platform tag first and stops, naming both, when the
bundle (gpu_bundle.sh records what it was made for in manifest.json) was made for another.

`select`: a wheel is installed only where this interpreter can use it (its tags); a GROUP (a
package and the compiled core it needs, e.g. pydantic and pydantic-core) is installed whole or
not at all, so a working copy on the machine is never shadowed by half a pair. CORE wheels (what
the project pins and its suite tests) are always installed; every other wheel only where the
machine lacks that distribution or has an older one, so nothing the machine's torch uses is
shadowed by an older copy.
"""

from __future__ import annotations

import json
import platform
import re
import sys
import sysconfig
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


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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
        by_name.setdefault(norm(whl.name.split("-")[0]), []).append(whl)
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
        version, mine = whl.name.split("-")[1], have.get(name)
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


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        return check(Path(argv[1]))
    if argv[:1] == ["select"]:
        argv = argv[1:]
    folder, listing = Path(argv[0]), Path(argv[1])
    names = {norm(w.name.split("-")[0]) for w in folder.glob("*.whl")}
    rows = select(folder, supported_tags(), {n: installed(n) for n in names})
    for whl, take, why in rows:
        print(f"  {'install' if take else 'skip   '} {norm(whl.name.split('-')[0])} {whl.name.split('-')[1]}: {why}")
    listing.write_text("".join(f"{whl}\n" for whl, take, _ in rows if take))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
