"""axe-core, the accessibility engine the console's browser tests inject into each page: fetched once
from the npm registry by `./scripts/test` (`python -m tests.axe`), checked against the registry's
sha512 integrity for this pinned version, and kept in .cache/ (the tests never reach the network)."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "4.14.1"
TARBALL = f"https://registry.npmjs.org/axe-core/-/axe-core-{VERSION}.tgz"
INTEGRITY = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
PATH = Path(__file__).resolve().parent.parent / ".cache" / f"axe-core-{VERSION}.min.js"


def fetch(path: Path = PATH) -> Path:
    """axe.min.js of the pinned version at `path`, downloaded and checked where it is not there yet."""
    if path.is_file():
        return path
    with urllib.request.urlopen(TARBALL, timeout=60) as r:  # noqa: S310 - the npm registry, a fixed https URL
        tarball = r.read()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if digest != INTEGRITY:
        raise SystemExit(f"axe-core {VERSION}: the tarball's sha512 is {digest}, the registry's integrity {INTEGRITY}")
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        member = tar.extractfile("package/axe.min.js")
        assert member is not None
        body = member.read()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".part").write_bytes(body)
    path.with_suffix(".part").replace(path)
    return path


if __name__ == "__main__":
    try:
        print(fetch())
    except OSError as exc:
        sys.exit(f"could not fetch axe-core {VERSION} from {TARBALL}: {exc} (the accessibility tests will fail)")
