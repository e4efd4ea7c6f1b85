"""Run by bench.studies.submit_ir under valgrind: one app, warmed up, then the measured submits.

    PYTHONPATH=CHECKOUT:REPO python -m bench.studies._submit_ir_child CHECKOUT VARIANT SUBMITS DIR

Started with its working directory in DIR and PYTHONPATH naming the checkout first, so `h3core`
(and the first round's `service`) import from CHECKOUT and only `bench` from this repository.
The app is the checkout's own (`create_app` with the zero-time fake executor, as `h3core serve`
builds it; the first round's layout, `service.app`, too), called straight as ASGI (http_load's
`_asgi`): no uvicorn, no sockets. Its lifespan is not started, so no runner runs: each submit is
stored (through the writer thread) and answered, as in bench.studies.submit's `api` role. Handshake
with the driver through files in DIR: `ready` (warmed up: the driver turns valgrind's
instrumentation on), `go`, then `done` (the driver turns it off), `exit`.

VARIANT `full` is the checkout as it is; the others switch one feature of the current layout off,
to attribute its cost (never a configuration to run): `no-log` (the runner's per-event log
records), `no-cross-site` (the cross-site middleware), `plain-request` (Litestar's request, not
the body-limit one).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio

from bench.throughput.http_load import SUBMIT_BODY, _asgi


def build_app(code: Path, variant: str, out: Path):  # noqa: ANN201 - either layout's app
    if (code / "service" / "app.py").exists():  # the first round's layout (3ac7012)
        import service.app as app_module  # type: ignore[import-not-found]
        from service.settings import Settings  # type: ignore[import-not-found]
    else:
        import h3core.service.app as app_module
        from h3core.runtime import _journal, logs
        from h3core.runtime.settings import Settings

        logs.configure("text", "info", open(out / "server.log", "w"))  # noqa: SIM115 - as `h3core serve` logs
        over: dict = {}
        if variant == "no-cross-site":
            over = {"middleware": []}
        elif variant == "plain-request":
            from litestar import Request

            over = {"request_class": Request}
        elif variant == "no-log":
            _journal.log_written = lambda *a: None  # type: ignore[assignment]
        elif variant != "full":
            raise SystemExit(f"unknown variant {variant!r}")
        litestar = app_module.Litestar
        app_module.Litestar = lambda *a, **kw: litestar(*a, **{**kw, **over})  # type: ignore[assignment]

    settings = Settings(db=out / "h3.db", artifacts=out / "artifacts", uploads=out / "uploads", slots=16)
    return app_module.create_app(settings.model_copy(update={"executor": "fake", "fake_step_seconds": 0}))


def wait(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    code, variant, submits, out = argv or sys.argv[1:]
    out_dir = Path(out)
    app = build_app(Path(code), variant, out_dir)
    body = json.dumps(SUBMIT_BODY).encode()

    async def run() -> None:
        for _ in range(50):  # warm: imports, caches, the writer thread
            assert await _asgi(app, "POST", "/v1/jobs", body) == 201
        (out_dir / "ready").touch()
        await anyio.to_thread.run_sync(wait, out_dir / "go")
        for _ in range(int(submits)):
            assert await _asgi(app, "POST", "/v1/jobs", body) == 201
        (out_dir / "done").touch()
        await anyio.to_thread.run_sync(wait, out_dir / "exit")

    anyio.run(run)
    os._exit(0)  # no teardown: nothing after the measured submits matters


if __name__ == "__main__":
    main()
