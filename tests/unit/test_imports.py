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


def _private_imports(path: Path) -> list[str]:
    """`from h3core... import _name` lines of one module: a private name used outside its module."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("h3core"):
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            found += [f"{path}:{node.lineno}: {name}" for name in private]
    return found


def test_no_module_imports_a_private_name_of_another():
    """Internals stay private: what two modules share is a public name (of a private module, where
    it is the package's internal, e.g. `h3core.adapters.store._sql`)."""
    package = Path(h3core.__file__).parent
    assert [hit for path in sorted(package.rglob("*.py")) for hit in _private_imports(path)] == []
