"""What importing a module drags in, checked in a fresh interpreter each time."""

from __future__ import annotations

import subprocess
import sys


def _imports(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_h3core_leaves_the_testing_package_alone():
    assert not {m for m in _imports("h3core") if m.startswith("h3core.testing")}
