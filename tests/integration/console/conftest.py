"""The console in a real browser: Debian's chromium-headless-shell driven by Playwright (never
`playwright install`: no browser is downloaded), against `h3core serve` in a subprocess.

The browser is found at H3_CHROMIUM, else where the Debian packages put it; `./scripts/test`
installs `chromium-headless-shell` when it is missing. Without one the tests skip when pytest is
run by hand, and fail under `./scripts/test` and CI (H3_REQUIRE_BROWSER or CI set), where a skipped
browser test would hide a missing browser."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.service.conftest import Server, Servers

CANDIDATES = (
    "/usr/bin/chromium-headless-shell",
    "/usr/lib/chromium/chromium-headless-shell",
    "/usr/bin/chromium",
)
SCREENSHOTS_ENV = "H3_CONSOLE_SCREENSHOTS"  # a folder to write the screenshots to as well (scripts/console-screenshots)
PROFILE = "4x2080ti-sage-fp16"  # the deployment's ceilings, applied to the fake executor


def chromium() -> str | None:
    given = os.environ.get("H3_CHROMIUM")
    if given:
        return given
    return next((p for p in CANDIDATES if Path(p).is_file()), None) or shutil.which("chromium-headless-shell")


@pytest.fixture(scope="module")
def browser() -> Iterator:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    path = chromium()
    if path is None:
        why = "no Chromium: apt-get install chromium-headless-shell (./scripts/test does), or set H3_CHROMIUM"
        if os.environ.get("H3_REQUIRE_BROWSER") or os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--autoplay-policy=no-user-gesture-required"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def api(server) -> Iterator:
    """A client of the module's `server`."""
    with server.client() as client:
        yield client


def signed_in(browser, server: Server, token: str, *, accept_dialogs: bool = True, **options):
    """A browser context and page signed in to `server` with `token`, every dialog accepted unless
    `accept_dialogs` is false (the test answers them); `options`: the context's
    (`java_script_enabled=False`, a viewport, ...)."""
    context = browser.new_context(base_url=server.url, **options)
    page = context.new_page()
    if accept_dialogs:
        page.on("dialog", lambda d: d.accept())
    page.goto("/console/signin")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/console")
    return context, page


def console_server(tmp_path_factory, name: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    s = Servers(tmp_path_factory.mktemp(name))
    server = s.start({"H3_CAPACITY_PROFILE": PROFILE, "H3_SLOTS": "4", **(env or {})})
    try:
        yield server
        server.stop()
    finally:
        s.kill_all()


class Screens:
    """Screenshots of each screen: under the test's temporary folder, and in H3_CONSOLE_SCREENSHOTS when set."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        extra = os.environ.get(SCREENSHOTS_ENV)
        self.extra = Path(extra) if extra else None

    def take(self, page, name: str) -> Path:
        path = self.folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        if self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.extra / path.name)
        return path


@pytest.fixture(scope="module")
def screens(tmp_path_factory) -> Screens:
    return Screens(tmp_path_factory.mktemp("screens"))


@pytest.fixture(scope="session")
def axe_source() -> str:
    """axe-core's script (tests/axe.py; `./scripts/test` fetches it): fails under CI without it."""
    from tests import axe

    if not axe.PATH.is_file():
        why = f"no axe-core at {axe.PATH}: run `python -m tests.axe` (./scripts/test does)"
        if os.environ.get("H3_REQUIRE_BROWSER") or os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return axe.PATH.read_text()


def axe_violations(page, source: str) -> list[str]:
    """What axe-core finds on the page as it is (WCAG 2.1 A and AA, and best practices): each
    violation's rule and the elements it names. The page's context must bypass its CSP, which
    (rightly) refuses any script the page did not ship."""
    page.add_script_tag(content=source)
    found = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map(v => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', ')}`)"
    )
    return list(found)
