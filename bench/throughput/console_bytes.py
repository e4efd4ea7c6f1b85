"""What an open console page costs the network: bytes a minute received by Chromium for a queue page
left open while nothing runs, and one watching 3 running jobs, this checkout against another commit
(issue 40: every update read the whole ~90 KB part, nothing was compressed).

    python -m bench.throughput.console_bytes                        # against 4bde5aa (before), 60 s each
    python -m bench.throughput.console_bytes --seconds 20 --against HEAD~3

For each side, `h3core serve` of that side's code (`git archive` of the other commit: no worktree),
the fake executor with steps of 0.2 s, 20 done jobs in the store; Debian's Chromium (as the
console's tests drive it) opens /console, and the Chrome DevTools Protocol counts every byte of
every response body as it came over the wire (`Network.dataReceived`'s encodedDataLength: after
gzip, the live stream included) for `--seconds`, then scales to a minute. Then the page is loaded
again, to show what a second visit costs (the script and style revalidated, 304, on this side).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import ROOT, export, print_load_at_end, print_machine, show, table
from bench.throughput.http_load import Server
from tests.integration.console.conftest import chromium

SIZE = {"width": 832, "height": 480, "frames": 24}


def settle(page) -> None:
    """Until the page has loaded what it shows (its thumbnails too), and a second more."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not page.evaluate("[...document.images].every((i) => i.complete)"):
        page.wait_for_timeout(100)
    page.wait_for_timeout(1000)


def watch(url: str, seconds: float, *, reload: bool = False) -> tuple[int, int]:
    """Bytes received by a queue page open for `seconds` (after its first load), and the requests made."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium())
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            cdp = page.context.new_cdp_session(page)
            cdp.send("Network.enable")
            received, requests = [0], [0]
            cdp.on("Network.dataReceived", lambda e: received.__setitem__(0, received[0] + e["encodedDataLength"]))
            cdp.on("Network.requestWillBeSent", lambda e: requests.__setitem__(0, requests[0] + 1))
            page.goto(f"{url}/console")
            settle(page)
            if reload:  # what a second visit costs: the page again, its files revalidated
                received[0] = requests[0] = 0
                page.reload()
                settle(page)
                return received[0], requests[0]
            received[0] = requests[0] = 0
            page.wait_for_timeout(seconds * 1000)
            return received[0], requests[0]
        finally:
            browser.close()


def side(code: Path, workdir: Path, seconds: float) -> dict[str, tuple[int, int]]:
    root = Path(tempfile.mkdtemp(dir=workdir))
    server = Server(db=root / "h3.db", root=root, slots=4, code=code, env={"H3_FAKE_STEP_SECONDS": "0.2"})
    server.start()
    out: dict[str, tuple[int, int]] = {}
    try:
        with httpx.Client(base_url=server.url, timeout=30) as api:
            for i in range(20):
                api.post("/v1/jobs", json={"prompt": f"a done fox {i} [fake step=0]", "steps": 2, **SIZE})
            time.sleep(3)
            out["idle queue page"] = watch(server.url, seconds)
            running = [
                api.post("/v1/jobs", json={"prompt": "a slow fox [fake step=0.2]", "steps": 1000, **SIZE}).json()["id"]
                for _ in range(3)
            ]
            time.sleep(1)
            out["queue page, 3 jobs running"] = watch(server.url, seconds)
            out["a second visit (load)"] = watch(server.url, seconds, reload=True)
            for job_id in running:
                api.post(f"/v1/jobs/{job_id}/cancel")
    finally:
        server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="4bde5aa", help="the commit to compare with (default 4bde5aa, before issue 40)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long each page is watched (scaled to a minute)")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3-console-bytes-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print_machine(workdir, f"console_bytes: bytes a minute to an open console page, this checkout against {args.against}")
    sides = {
        args.against: side(export(args.against, workdir), workdir, args.seconds),
        "this checkout": side(ROOT, workdir, args.seconds),
    }
    t = table(
        "Bytes received by Chromium",
        ["page", *(f"{name}: KB/min (requests)" for name in sides), "before ÷ after"],
        caption=f"each page watched {args.seconds:g} s and scaled to a minute (a second visit: the load itself, not scaled); "
        "bytes as they came over the wire (after gzip), the live stream included",
    )
    for what in next(iter(sides.values())):
        scale = 1.0 if what.startswith("a second visit") else 60.0 / args.seconds
        figures = [(b * scale / 1000, n) for b, n in (s[what] for s in sides.values())]
        ratio = figures[0][0] / figures[1][0] if figures[1][0] else float("inf")
        t.add_row(what, *(f"{kb:,.1f} ({n})" for kb, n in figures), f"{ratio:,.1f}")
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
