"""What importing a module drags in, checked in a fresh interpreter each time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import h3core


def _imports(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_h3core_leaves_the_testing_package_alone():
    assert not {m for m in _imports("h3core") if m.startswith("h3core.testing")}


ROUTES = sorted(p.stem for p in (Path(h3core.__file__).parent / "service" / "routes").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", ROUTES)
def test_a_routes_module_imports_alone_without_the_app(name):
    """Routes take the `Service` from its own module: importing one never imports the app, so
    there is no import circle between them."""
    loaded = _imports(f"h3core.service.routes.{name}")
    assert f"h3core.service.routes.{name}" in loaded
    assert "h3core.service.app" not in loaded
