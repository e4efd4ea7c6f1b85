"""The console's pages under axe-core (tests/axe.py), at a desktop's width and a phone's, in light and
dark: the queue, a running, a failed and a done job, submit and the box; and what the phone width
asks besides: nothing to scroll sideways but the tables' own scrollers, which the keyboard reaches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.console.conftest import axe_violations, console_server
from tests.integration.service.conftest import Server, cancel_quietly, long_job, submit, wait_job

SIZE = {"width": 832, "height": 480}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from console_server(tmp_path_factory, "console-a11y")


@pytest.fixture(scope="module")
def pages(server) -> Iterator[dict[str, str]]:
    """A path for each page to check, with a job in each state it shows."""
    with server.client() as api:
        done = wait_job(api, submit(api, prompt="a done fox [fake step=0]", **SIZE)["id"])
        failed = wait_job(api, submit(api, prompt="a fox that fails [fake step=0 fail_at=1 kind=oom]", **SIZE)["id"])
        running = long_job(api, steps=1000, step=0.5, **SIZE)["id"]
        wait_job(api, running, ("running",))
        yield {
            "queue": "/console",
            "running job": f"/console/jobs/{running}",
            "failed job": f"/console/jobs/{failed['id']}",
            "done job": f"/console/jobs/{done['id']}",
            "submit": "/console/submit",
            "box": "/console/box",
        }
        cancel_quietly(api, running)


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1280, 390])
def test_axe_finds_nothing_on_any_page(browser, server, pages, axe_source, width, scheme):
    context = browser.new_context(
        base_url=server.url, viewport={"width": width, "height": 900}, color_scheme=scheme, bypass_csp=True
    )
    page = context.new_page()
    found: dict[str, list[str]] = {}
    try:
        for name, path in pages.items():
            page.goto(path)
            if name == "submit":
                page.wait_for_selector("#frames option", state="attached")
            violations = axe_violations(page, axe_source)
            if violations:
                found[name] = violations
            # At a phone's width nothing but a table's own scroller is wider than the screen.
            wide = page.evaluate(
                "w => [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > w + 1"
                " && !e.closest('.scroll')).map(e => e.tagName + '.' + e.className).slice(0, 5)",
                width,
            )
            assert not wide and page.evaluate("document.documentElement.scrollWidth") <= width, (name, wide)
    finally:
        context.close()
    assert not found, found


def _page(browser, server, width: int):
    context = browser.new_context(base_url=server.url, viewport={"width": width, "height": 900})
    return context, context.new_page()


def test_each_label_of_the_submit_form_is_beside_its_control(browser, server, pages):
    context, page = _page(browser, server, 1280)
    try:
        page.goto(pages["submit"])
        page.wait_for_selector("#frames option", state="attached")
        # The limit note takes a row of its own, not a cell that pushes the labels one row off.
        off = page.evaluate(
            "[...document.querySelectorAll('form.submit fieldset:not([hidden]) label[for]')].map(l => {"
            " const c = document.getElementById(l.htmlFor); const a = l.getBoundingClientRect(), b = c.getBoundingClientRect();"
            " return [l.htmlFor, Math.abs((a.top + a.bottom) / 2 - (b.top + b.bottom) / 2)]; }).filter(([, d]) => d > 12)"
        )
        assert off == [], off
    finally:
        context.close()


def test_the_queue_s_buttons_sit_inside_their_rows(browser, server, pages):
    context, page = _page(browser, server, 1280)
    try:
        page.goto(pages["queue"])
        outside = page.evaluate(
            "[...document.querySelectorAll('section.jobs tr button')].filter(b => { const r = b.closest('tr')"
            ".getBoundingClientRect(), s = b.getBoundingClientRect(); return s.top < r.top - 1 || s.bottom > r.bottom + 1; })"
            ".map(b => b.getAttribute('aria-label'))"
        )
        assert outside == [], outside
    finally:
        context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_control_borders_stand_out_from_the_page(browser, server, pages, scheme):
    context, page = _page(browser, server, 1280)
    try:
        page.emulate_media(color_scheme=scheme)
        for name in ("queue", "submit"):
            page.goto(pages[name])
            low = page.evaluate(CONTRAST_OF_CONTROLS)
            assert low == [], (name, low)  # 3:1 or more (WCAG 1.4.11)
    finally:
        context.close()


def test_a_phone_sees_progress_eta_kind_and_prompt_without_scrolling_sideways(browser, server, pages):
    context, page = _page(browser, server, 390)
    try:
        page.goto(pages["queue"])
        for what in ("progress", ".eta", ".kind", "td.prompt"):
            boxes = page.eval_on_selector_all(f"section.jobs {what}", "es => es.map(e => e.getBoundingClientRect().right)")
            assert boxes and max(boxes) <= 390, (what, boxes)
        page.goto(pages["done job"])
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # the sha256 and paths wrap
    finally:
        context.close()


# The contrast of each visible control's border against the page behind it, below 3:1.
CONTRAST_OF_CONTROLS = """(() => {
  const lum = (c) => { const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map((v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const page = lum(getComputedStyle(document.body).backgroundColor);
  return [...document.querySelectorAll('button, select, input:not([type=checkbox]), textarea')]
    .filter((e) => e.offsetParent !== null)
    .map((e) => { const b = lum(getComputedStyle(e).borderTopColor);
      return [e.id || e.className || e.tagName, (Math.max(b, page) + 0.05) / (Math.min(b, page) + 0.05)]; })
    .filter(([, ratio]) => ratio < 3);
})()"""
