"""Which of the bundled wheels to install (run with the machine's own python, before the target is on
PYTHONPATH). Prints one line per wheel and writes the chosen paths to argv[2].

CORE wheels are what the check imports and the project pins: always installed, so the run
measures the versions tested here. Every other wheel is a dependency the machine may already
have: installed only where it lacks that distribution or has an older one, so nothing the
machine's torch uses is shadowed by an older copy.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

CORE = {"diffusers", "sageattention", "pydantic", "pydantic-core", "sqlite-utils", "sqlite-fts4", "click-default-group", "av"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_key(v: str):
    try:
        from packaging.version import Version

        return Version(v)
    except Exception:  # noqa: BLE001 - no packaging, or a version it cannot parse: the leading numbers
        return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def main() -> None:
    folder, listing = Path(sys.argv[1]), Path(sys.argv[2])
    chosen = []
    for whl in sorted(folder.glob("*.whl")):
        dist, version = whl.name.split("-")[:2]
        name = norm(dist)
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if name in CORE:
            take, why = True, "core" + (f" (the machine's {have} is shadowed)" if have else "")
        elif have is None:
            take, why = True, "missing here"
        elif version_key(have) < version_key(version):
            take, why = True, f"the machine has older {have}"
        else:
            take, why = False, f"the machine has {have}: kept"
        print(f"  {'install' if take else 'skip   '} {name} {version}: {why}")
        if take:
            chosen.append(str(whl))
    listing.write_text("".join(f"{c}\n" for c in chosen))


if __name__ == "__main__":
    main()
