"""/console: the operator's pages, rendered here from the same reads the API makes; the pages'
script only follows changes and calls /v1 (service/console/static/console.js). Every asset is in
the package: a GPU box is often offline."""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache
from typing import Annotated, Any
from urllib.parse import urlencode

import anyio
from jinja2 import Environment, PackageLoader, select_autoescape
from litestar import Request, Response, Router, get, post
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Redirect, ServerSentEvent
from litestar.response.sse import ServerSentEventMessage
from pydantic import ValidationError

from h3core.adapters.store.nodes import WithNodeLeases
from h3core.domain.state import JobState
from h3core.domain.story import why
from h3core.executors.reports import DeviceMemory
from h3core.runtime.draining import NoSuchNode, set_draining
from h3core.runtime.errors import NotCancellable, NotQueued
from h3core.service import files
from h3core.service.auth import (
    SESSION_COOKIE,
    SESSION_SECONDS,
    bearer_matches,
    requester,
    session_matches,
    session_value,
    token_matches,
)
from h3core.service.cancelling import cancel
from h3core.service.compression import UNCOMPRESSED
from h3core.service.console.live import changes
from h3core.service.console.queue import (
    MODES,
    SINCE,
    STATUS_CHOICES,
    Filter,
    UnknownChoice,
    expected_starts,
    page,
    row,
    rows,
    sort_rows,
)
from h3core.service.console.timeline import event_rows, timeline
from h3core.service.context import Service
from h3core.service.crosssite import OWN_CONTENT_TYPES_OPT
from h3core.service.requests import JobCreate
from h3core.service.routes.jobs import admit, retry
from h3core.service.routes.ops import readiness
from h3core.service.submission import in_thread, job_state, point_read
from h3core.service.views import NodeView, ceilings_view

__all__ = ["CONSOLE_PATH", "console_router", "render_queue"]

CONSOLE_PATH = "/console"
PAGE_SIZE = 50
RUNNING_SHOWN = 200  # the running jobs the first page lists (more: the status filter pages them)
QUEUED_SHOWN = 50
QUEUED = ("submitted", "queued")
# What a console page may load and run: its own files only (no inline script, no other origin).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
STATIC = {"console.css": "text/css", "console.js": "text/javascript", "icon.svg": "image/svg+xml"}


@cache
def _templates() -> Environment:
    env = Environment(loader=PackageLoader("h3core.service.console"), autoescape=select_autoescape(default=True))
    env.globals.update(base=CONSOLE_PATH, modes=MODES, statuses=STATUS_CHOICES, since_choices=tuple(SINCE))
    env.filters["num"] = num
    env.filters["gib"] = gib
    env.filters["merge"] = lambda query, **more: {**query, **more}
    return env


def num(value: float | int) -> str:
    """A figure for a reader: at most two decimals, no trailing zeros (2.3333333333333335 -> 2.33)."""
    return f"{value:.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def gib(size: int) -> str:
    """A size in bytes for a reader, in GiB to a tenth (150754820096 -> "140.4 GiB")."""
    return f"{size / 2**30:.1f} GiB"


def _html(template: str, status_code: int = 200, **context) -> Response[str]:
    body = _templates().get_template(template).render(**context)
    return Response(body, status_code=status_code, media_type="text/html; charset=utf-8", headers=_page_headers())


def _page_headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "Cache-Control": "no-store", "Referrer-Policy": "same-origin"}


def _signed_in(svc: Service, request: Request) -> bool:
    tokens = svc.settings.api_tokens
    if not tokens:
        return True
    return bearer_matches(request.headers.get("authorization"), tokens) or session_matches(
        request.cookies.get(SESSION_COOKIE), tokens
    )


def _to_signin(request: Request) -> Response:
    """Where a page sends someone not signed in: the sign-in page, coming back here after. A page's
    part (`fragment`, read by the page's script) answers 401 instead, so that the script can say the
    session has ended rather than put the sign-in page inside the page it updates."""
    if request.query_params.get("fragment") or request.url.path == f"{CONSOLE_PATH}/rows":
        raise HTTPException(status_code=401, detail="signed out: sign in again")
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return Redirect(f"{CONSOLE_PATH}/signin?{urlencode({'next': here})}", status_code=303)


def _safe_next(given: str | None) -> str:
    """Where to go after signing in: a console page of this service only (no open redirect)."""
    if given and given.startswith(CONSOLE_PATH) and not given.startswith("//") and "\\" not in given:
        return given
    return CONSOLE_PATH


def _problem(status_code: int, title: str, message: str, svc: Service) -> Response[str]:
    """A page saying what is wrong (an unknown job, a filter's unknown choice), in the console's look,
    with its status code: never the API's raw JSON in a browser tab."""
    return _html("problem.html", status_code=status_code, page="problem", title=title, message=message, **_common(svc))


def _common(svc: Service) -> dict:
    return {"signed": bool(svc.settings.api_tokens)}


# -- the queue ------------------------------------------------------------------------------------


Cursor = Annotated[int | None, QueryParameter(ge=0, le=2**63 - 1)]


def _counts(svc: Service) -> dict[str, int]:
    """The jobs by status as the queue shows them: a `submitted` job is queued."""
    counts = svc.store.counts()
    counts["queued"] = counts.get("queued", 0) + counts.pop("submitted", 0)
    return counts


def _queue_context(svc: Service, wanted: Filter, before: int | None, after: int | None) -> dict:
    """Every read the queue page makes, in one worker thread."""
    now = datetime.now(UTC)
    store = svc.store
    counts = _counts(svc)
    paged = before is not None or after is not None
    # The first page without a status filter: the running and the queued first, then what ended.
    split = wanted.status is None and not paged
    running = queued = None
    if split:
        only = lambda status: replace(wanted, status=status, sort=None)  # noqa: E731
        running_states = page(store, only("running"), now, limit=RUNNING_SHOWN).jobs
        running = rows(running_states, now)
        # The queue in the order its jobs will start (priority first), each with its place and an
        # estimated start; the filter picks among the first QUEUED_SHOWN.
        head = store.queued(limit=QUEUED_SHOWN)
        starts = expected_starts(head, running_states, svc.settings.slots)
        queued = [
            row(state, now, position=i + 1, expected_start=start)
            for i, (state, start) in enumerate(zip(head, starts, strict=True))
            if wanted.matches(state, now)
        ]
        listed = page(store, replace(wanted, status="ended"), now, limit=PAGE_SIZE)
    else:
        listed = page(store, wanted, now, limit=PAGE_SIZE, before=before, after=after)
    query = wanted.query()
    return {
        "filter": wanted,
        "counts": counts,
        "running": running,
        "queued": queued,
        "jobs": sort_rows(
            [row(s, now, position=store.queue_position(s.job_id) if s.status in QUEUED else None) for s in listed.jobs],
            wanted.sort,
        ),
        "listed_title": "Ended" if split else "Jobs",
        "queued_more": counts.get("queued", 0) > QUEUED_SHOWN,
        "newer": f"?{urlencode({**query, 'after': listed.newer})}" if listed.newer is not None else None,
        "older": f"?{urlencode({**query, 'before': listed.older})}" if listed.older is not None else None,
        "cut_short": listed.cut_short,
        "scanned": listed.scanned,
        "now": now,
    }


@get("/", include_in_schema=False)
async def queue_page(
    svc: NamedDependency[Service],
    request: Request,
    status: FromQuery[str | None] = None,
    mode: FromQuery[str | None] = None,
    q: FromQuery[str | None] = None,
    since: FromQuery[str | None] = None,
    before: Cursor = None,
    after: Cursor = None,
    fragment: FromQuery[bool] = False,
    sort: FromQuery[str | None] = None,
    said: FromQuery[str | None] = None,
    n: FromQuery[int] = 0,
    skipped: FromQuery[int] = 0,
    failed: FromQuery[int] = 0,
) -> Response:
    if not _signed_in(svc, request):
        return _to_signin(request)
    try:
        wanted = Filter.of(status, mode, q, since, sort)
    except UnknownChoice as exc:
        return _problem(400, f"No such {exc.name}", f"{exc}.", svc)
    return await in_thread(render_queue, svc, wanted, before, after, fragment, bulk_said(said, n, skipped, failed))


def render_queue(
    svc: Service, wanted: Filter, before: int | None, after: int | None, fragment: bool, said: str | None = None
) -> Response[str]:
    """The queue page (or, with `fragment`, the part live updates replace): its reads and its
    rendering, on the calling thread (bench/throughput/console.py times this)."""
    context = _queue_context(svc, wanted, before, after)
    page_name = "queue_body.html" if fragment else "queue.html"
    return _html(page_name, page="queue", said=said, **_common(svc), **context)


MAX_ROWS = 50  # the rows one update may ask for (the page's script asks for the whole part past it)


@get("/rows", include_in_schema=False)
async def queue_rows(
    svc: NamedDependency[Service],
    request: Request,
    id: Annotated[list[str], QueryParameter(max_items=MAX_ROWS, min_items=1)],  # noqa: A002 - the query's name
) -> Response:
    """The queue rows of the jobs `id` names (those that exist) and the counts: what a live update of
    the queue reads when only some rows changed."""
    if not _signed_in(svc, request):
        return _to_signin(request)

    def render() -> Response:
        now = datetime.now(UTC)
        states = [s for s in (svc.store.get(job_id) for job_id in dict.fromkeys(id)) if s is not None]
        return _html("queue_rows.html", page="queue", counts=_counts(svc), jobs=rows(states, now), **_common(svc))

    return await in_thread(render)


# -- a job ----------------------------------------------------------------------------------------


@get("/jobs/{job_id:str}", include_in_schema=False)
async def job_page(
    svc: NamedDependency[Service],
    request: Request,
    job_id: FromPath[str],
    fragment: FromQuery[bool] = False,
    said: FromQuery[str | None] = None,
) -> Response:
    if not _signed_in(svc, request):
        return _to_signin(request)
    state = await point_read(svc, svc.store.get, job_id)
    if state is None:
        if fragment:
            raise NotFoundException(f"no job {job_id!r}")
        return _problem(404, "No such job", f"There is no job {job_id!r} in this store.", svc)

    def render() -> Response:
        events = svc.store.events(job_id)
        now = datetime.now(UTC)
        request_fields = state.request.model_dump(exclude_none=True)
        deleted = files.deleted_at(svc.store, svc.artifacts, state) if state.artifact is not None else None
        context: dict[str, Any] = {
            "job": state,
            "row": rows([state], now)[0],
            "params": request_fields,
            "why": why(state, events, now),
            "timeline": timeline(events, now),
            "events": event_rows(events),
            "video": state.artifact is not None and deleted is None,
            "deleted_at": deleted,
            "said": SAID.get(said or ""),
            "deliveries": svc.store.deliveries(job_id) if state.webhook is not None else [],
            "inputs": _input_images(state),
        }
        return _html("job_body.html" if fragment else "job.html", page="job", **_common(svc), **context)

    return await in_thread(render)


def _input_images(state: JobState) -> list[tuple[str, str]]:
    """The images a job was given, as (what, upload id): its keyframes and reference images."""
    r = state.request
    out = [
        (f"{name} frame", getattr(r.keyframes, name)) for name in ("first", "last") if r.keyframes and getattr(r.keyframes, name)
    ]
    return out + [(f"reference {i}", u) for i, u in enumerate(r.references.images if r.references else (), 1)]


@get("/uploads/{upload_id:str}", include_in_schema=False)
async def upload_image(svc: NamedDependency[Service], request: Request, upload_id: FromPath[str]) -> Response:
    """An uploaded image, for the preview on its job's page: images only (a video or a sound upload is
    not shown here), in the type it was stored as."""
    if not _signed_in(svc, request):
        raise HTTPException(status_code=401, detail="signed out: sign in again")

    def read() -> tuple[bytes, str] | None:
        upload = svc.uploads.get(upload_id)
        if upload is None or upload.kind != "image":
            return None
        return svc.uploads.path(upload).read_bytes(), upload.content_type

    found = await in_thread(read)
    if found is None:
        raise NotFoundException(f"no uploaded image {upload_id!r}")
    body, content_type = found
    return Response(body, media_type=content_type, headers={"Cache-Control": "private, max-age=3600"})


# -- actions without the script: plain form posts ----------------------------------------------------

# What a page says after a form's action (`?said=`): fixed texts, never the query's own words.
SAID = {
    "cancelled": "Cancelled.",
    "cancel-asked": "Cancel asked: the job stops at its next step.",
    "already-ended": "The job had already ended: nothing to cancel.",
    "not-ended": "The job has not ended: only an ended job is retried.",
    "priority-set": "Priority set.",
    "not-queued": "The job is no longer queued: it keeps its place.",
    "bad-priority": "A priority is a whole number from -100 to 100.",
    "drained": "Node marked draining: it takes no new jobs; what it runs goes on.",
    "undrained": "Drain cleared: the node takes new jobs again.",
}


def _back(job_id: str, said: str) -> Redirect:
    return Redirect(f"{CONSOLE_PATH}/jobs/{job_id}?{urlencode({'said': said})}", status_code=303)


@post("/jobs/{job_id:str}/cancel", include_in_schema=False, status_code=303, opt={OWN_CONTENT_TYPES_OPT: True})
async def cancel_form(svc: NamedDependency[Service], request: Request, job_id: FromPath[str]) -> Response:
    """The Cancel button without the page's script: the cancel, then back to the job's page saying what
    became of it. (The cross-site rules hold: a post from another site's page is refused.)"""
    if not _signed_in(svc, request):
        return _to_signin(request)
    try:
        state = await cancel(svc, job_id, reason="cancelled from the console", by=requester(request, svc.settings.api_tokens))
    except KeyError:
        raise NotFoundException(f"no job {job_id!r}") from None
    except NotCancellable:
        return _back(job_id, "already-ended")
    return _back(job_id, "cancelled" if state.status == "cancelled" else "cancel-asked")


@post("/jobs/{job_id:str}/priority", include_in_schema=False, status_code=303, opt={OWN_CONTENT_TYPES_OPT: True})
async def priority_form(svc: NamedDependency[Service], request: Request, job_id: FromPath[str]) -> Response:
    """Set priority without the page's script: back to the job's page saying what became of it."""
    if not _signed_in(svc, request):
        return _to_signin(request)
    given = str((await request.form()).get("priority") or "")
    if not _integer(given) or not -100 <= int(given) <= 100:
        return _back(job_id, "bad-priority")
    try:
        await svc.submissions.reprioritize(job_id, int(given), by=requester(request, svc.settings.api_tokens))
    except KeyError:
        raise NotFoundException(f"no job {job_id!r}") from None
    except NotQueued:
        return _back(job_id, "not-queued")
    return _back(job_id, "priority-set")


MAX_BULK = RUNNING_SHOWN + QUEUED_SHOWN + PAGE_SIZE  # every box one queue page shows


def bulk_said(said: str | None, done: int, skipped: int, failed: int) -> str | None:
    """What the queue says after Cancel selected or Retry selected posted without the script (as
    the script says it): fixed words around the counts, never the query's own words."""
    if said == "bulk-cancel":
        text, why_skipped, why_failed = f"Cancel asked for {done} job(s)", "already ended", "not found"
    elif said == "bulk-retry":
        text, why_skipped, why_failed = f"Retried {done} job(s)", "not ended yet", "refused or not found"
    else:
        return None
    if skipped:
        text += f"; {skipped} skipped ({why_skipped})"
    if failed:
        text += f"; {failed} {why_failed}"
    return text + "."


@post("/bulk", include_in_schema=False, status_code=303, opt={OWN_CONTENT_TYPES_OPT: True})
async def bulk_form(svc: NamedDependency[Service], request: Request) -> Response:
    """Cancel selected (`action=cancel`) or Retry selected (`action=retry`) without the page's script:
    each picked job (`job`) it applies to, a cancel on those still queued or running (stored, not
    waited for), a retry on those that ended, each logged with who asked; then back to the queue
    saying what it did to how many."""
    if not _signed_in(svc, request):
        return _to_signin(request)
    form = await request.form()
    action = str(form.get("action") or "")
    picked = list(dict.fromkeys(str(j) for j in form.getall("job")))
    if action not in ("cancel", "retry"):
        return _problem(400, "No such action", "A selection is cancelled (action=cancel) or retried (action=retry).", svc)
    if len(picked) > MAX_BULK:
        return _problem(400, "Too many jobs", f"At most {MAX_BULK} jobs at once; {len(picked)} were picked.", svc)
    by = requester(request, svc.settings.api_tokens)
    done = skipped = failed = 0
    for job_id in picked:
        state = await point_read(svc, svc.store.get, job_id)
        if state is None:
            failed += 1
        elif state.terminal != (action == "retry"):
            skipped += 1  # a cancel of an ended job, a retry of one not ended
        elif action == "cancel":
            try:
                await svc.submissions.cancel(job_id, "cancelled from the console", wait_s=0, by=by)
                done += 1
            except NotCancellable:  # it ended meanwhile
                skipped += 1
        else:
            try:
                await retry(svc, state, request)
                done += 1
            except HTTPException:  # refused by admission now
                failed += 1
    query = {"said": f"bulk-{action}", "n": done, "skipped": skipped, "failed": failed}
    return Redirect(f"{CONSOLE_PATH}?{urlencode(query)}", status_code=303)


@post("/jobs/{job_id:str}/retry", include_in_schema=False, status_code=303, opt={OWN_CONTENT_TYPES_OPT: True})
async def retry_form(svc: NamedDependency[Service], request: Request, job_id: FromPath[str]) -> Response:
    """The Retry button without the page's script: the new job's page, or back saying why not."""
    if not _signed_in(svc, request):
        return _to_signin(request)
    state = await job_state(svc, job_id)
    if not state.terminal:
        return _back(job_id, "not-ended")
    submission = await retry(svc, state, request)
    return Redirect(f"{CONSOLE_PATH}/jobs/{submission.state.job_id}", status_code=303)


# -- submit and the box ---------------------------------------------------------------------------


FPS = 24
FORM_FIELDS = ("mode", "prompt", "negative_prompt", "frames", "steps", "seed", "priority", "quality")  # and `size`
NUMBERS = ("width", "height", "frames", "steps", "seed", "priority")


def _integer(text: str) -> bool:
    return text.strip().removeprefix("-").isdigit()


def frame_choices(low: int, high: int) -> list[int]:
    """The frame counts the form offers for a ceiling row: its least, each whole second, its most
    (console.js's `frameChoices`, for a page read without the script)."""
    return sorted({low, high, *(f for f in range(FPS, high + 1, FPS) if f >= low)})


def _form(svc: Service) -> dict[str, Any]:
    """What the submit form offers before its script refines it: the modes and sizes /v1/ceilings
    admits, and the lengths of the first mode's first size."""
    rows = [
        r
        for r in ceilings_view(svc.contract.current(), svc.contract.ceilings()).ceilings
        if r.max_frames >= r.min_frames and r.reason != "mode_unavailable"
    ]
    modes = list(dict.fromkeys(r.mode for r in rows))
    sizes = list(dict.fromkeys(f"{r.width}x{r.height}" for r in rows if modes and r.mode == modes[0]))
    first = next((r for r in rows if modes and r.mode == modes[0]), None)
    frames = frame_choices(first.min_frames, first.max_frames) if first else []
    return {"form_modes": modes, "form_sizes": sizes, "form_frames": frames}


@get("/submit", include_in_schema=False)
async def submit_page(svc: NamedDependency[Service], request: Request) -> Response:
    if not _signed_in(svc, request):
        return _to_signin(request)
    return _html("submit.html", page="submit", refused=None, **_form(svc), **_common(svc))


@post("/submit", include_in_schema=False, status_code=303, opt={OWN_CONTENT_TYPES_OPT: True})
async def submit_form(svc: NamedDependency[Service], request: Request) -> Response:
    """The submit form posted without the page's script (the prompt in the body, never in a URL): the
    new job's page, or the form again saying what was refused and why (each field's message)."""
    if not _signed_in(svc, request):
        return _to_signin(request)
    if request.content_type[0].lower() != "application/x-www-form-urlencoded":
        raise HTTPException(status_code=415, detail="post the form: Content-Type application/x-www-form-urlencoded")
    form = await request.form()
    width, _, height = str(form.get("size") or "").partition("x")
    given: dict[str, object] = {k: str(v) for k, v in form.items() if k in FORM_FIELDS}
    given.update(width=width, height=height)
    if not str(given.get("negative_prompt", "")).strip():
        given.pop("negative_prompt", None)
    # A form's numbers are text; the API's model is strict about types, so they are read here.
    given.update({k: int(v) for k, v in given.items() if k in NUMBERS and isinstance(v, str) and _integer(v)})
    try:
        data = JobCreate.model_validate(given)
        submission = await admit(svc, data.generation(), priority=data.priority, by=requester(request, svc.settings.api_tokens))
    except ValidationError as exc:
        refused = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    except HTTPException as exc:
        errors = (exc.extra or {}).get("errors", []) if isinstance(exc.extra, dict) else []
        refused = "; ".join([exc.detail, *(e["message"] for e in errors if e["message"] not in exc.detail)])
    else:
        return Redirect(f"{CONSOLE_PATH}/jobs/{submission.state.job_id}", status_code=303)
    return _html("submit.html", status_code=422, page="submit", refused=refused, **_form(svc), **_common(svc))


@get("/box", include_in_schema=False)
async def box_page(
    svc: NamedDependency[Service], request: Request, fragment: FromQuery[bool] = False, said: FromQuery[str | None] = None
) -> Response:
    """The box: its load now (jobs running of its slots, the queue's depth, each runner node's share,
    with Drain and Clear drain), readiness per mode, device groups, the attention probe and the
    ceilings; the page reads its part again every few seconds (`fragment`)."""
    if not _signed_in(svc, request):
        return _to_signin(request)
    ready = (await readiness(svc)).content
    ceilings = ceilings_view(svc.contract.current(), svc.contract.ceilings())
    counts = await in_thread(_counts, svc)
    store = svc.store  # the nodes as the store has them now: a drain just set shows at once
    nodes = [NodeView.of(n) for n in await in_thread(store.leases.nodes)] if isinstance(store, WithNodeLeases) else []
    devices, devices_unread = await _device_memory(svc)
    return _html(
        "box_body.html" if fragment else "box.html",
        page="box",
        devices=devices,
        devices_unread=devices_unread,
        counts=counts,
        slots=sum(n.slots for n in nodes if n.alive) if nodes else svc.settings.slots,
        nodes=nodes,
        said=SAID.get(said or ""),
        ready=ready,
        ceilings=ceilings,
        settings=svc.settings,
        started=svc.started,
        role=svc.settings.role,
        **_common(svc),
    )


DEVICE_MEMORY_WAIT_S = 2.0  # the box page does not wait longer for an executor's devices (a server it asks)


async def _device_memory(svc: Service) -> tuple[list[DeviceMemory] | None, str | None]:
    """This process's executor's devices' memory (None: it does not know, or runs in another
    process), and why they could not be read (None: they were, or there is nothing to read)."""
    if svc.runner is None:
        return None, None
    try:
        with anyio.fail_after(DEVICE_MEMORY_WAIT_S):
            found = await svc.runner.executor.device_memory()
    except TimeoutError:
        return None, f"not read: the executor did not answer within {DEVICE_MEMORY_WAIT_S:g} s"
    except Exception as exc:  # a server that is down: said on the page, never a failed page
        return None, f"not read: {exc}"
    return (list(found) if found is not None else None), None


@post("/nodes/{node_id:str}/drain", include_in_schema=False, status_code=303, opt={OWN_CONTENT_TYPES_OPT: True})
async def drain_form(svc: NamedDependency[Service], request: Request, node_id: FromPath[str]) -> Response:
    """The box page's Drain (`draining=yes`) and Clear drain (`draining=no`) buttons, with or without
    the page's script: the change, logged with who asked, then back to the box saying it."""
    if not _signed_in(svc, request):
        return _to_signin(request)
    draining = str((await request.form()).get("draining") or "") == "yes"
    try:
        await in_thread(set_draining, svc.store, node_id, draining, requester(request, svc.settings.api_tokens))
    except NoSuchNode as exc:
        raise NotFoundException(str(exc)) from None
    said = "drained" if draining else "undrained"
    return Redirect(f"{CONSOLE_PATH}/box?{urlencode({'said': said})}", status_code=303)


# -- signing in -----------------------------------------------------------------------------------


@get("/signin", include_in_schema=False)
async def signin_page(svc: NamedDependency[Service], next: FromQuery[str | None] = None) -> Response:  # noqa: A002 - the query's name
    return _html("signin.html", page="signin", next=_safe_next(next), error=None, tokens=bool(svc.settings.api_tokens))


@post(
    "/signin",
    include_in_schema=False,
    status_code=303,
    # A form, which the cross-site rules refuse on every other route: this one reads only its own
    # type, and a post from another site's page is still refused by its Origin before it gets here.
    opt={OWN_CONTENT_TYPES_OPT: True},
)
async def signin(svc: NamedDependency[Service], request: Request) -> Response:
    if request.content_type[0].lower() != "application/x-www-form-urlencoded":
        raise HTTPException(status_code=415, detail="sign in with the form: Content-Type application/x-www-form-urlencoded")
    form = await request.form()
    target = _safe_next(form.get("next"))
    tokens = svc.settings.api_tokens
    if not tokens:
        return Redirect(target, status_code=303)
    if not token_matches(str(form.get("token") or ""), tokens):
        return _html(
            "signin.html",
            status_code=401,
            page="signin",
            next=target,
            error="That token is not one this service accepts.",
            tokens=True,
        )
    response = Redirect(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session_value(str(form.get("token")).strip()),
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@post("/signout", include_in_schema=False, status_code=303, opt={OWN_CONTENT_TYPES_OPT: True})
async def signout() -> Response:
    response = Redirect(f"{CONSOLE_PATH}/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# -- live, and the files --------------------------------------------------------------------------


@get("/stream", include_in_schema=False, opt={UNCOMPRESSED: True})
async def stream(svc: NamedDependency[Service], request: Request) -> Response:
    """The ids of jobs that changed, at most 4 times a second (Server-Sent Events, `changed`)."""
    if not _signed_in(svc, request):
        raise HTTPException(status_code=401, detail="sign in first (or send Authorization: Bearer <token>)")

    async def messages() -> AsyncIterator[ServerSentEventMessage]:
        yield ServerSentEventMessage(event="hello", data="{}", retry=2000)
        async for ids in changes(svc.bus, stopping=lambda: svc.stopping):
            if ids is None:
                yield ServerSentEventMessage(comment="keep-alive", data=None)
            else:
                yield ServerSentEventMessage(event="changed", data=json.dumps({"jobs": ids}))

    return ServerSentEvent(messages())


@cache
def _static_file(name: str) -> tuple[bytes, str]:
    """A console file and its ETag (its content's hash: a new release is a new tag)."""
    body = (importlib.resources.files("h3core.service.console") / "static" / name).read_bytes()
    return body, f'"{hashlib.sha256(body).hexdigest()[:32]}"'


@get("/static/{name:str}", include_in_schema=False, sync_to_thread=False)
def static(request: Request, name: FromPath[str]) -> Response[bytes]:
    """A console file; `no-cache` with its ETag: the browser asks each time and gets a 304 while it has
    this release's copy (a page load costs a few hundred bytes, not the script and the style again)."""
    if name not in STATIC:
        raise NotFoundException(f"no console file {name!r}")
    body, etag = _static_file(name)
    headers = {"Cache-Control": "no-cache", "ETag": etag}
    if etag in (t.strip() for t in request.headers.get("if-none-match", "").split(",")):
        return Response(b"", status_code=304, headers=headers)
    return Response(body, media_type=STATIC[name], headers=headers)


def console_router() -> Router:
    """/console. Its pages check the session themselves: a page sends one to sign in rather than
    answering 401."""
    return Router(
        path=CONSOLE_PATH,
        route_handlers=[
            queue_page,
            queue_rows,
            job_page,
            upload_image,
            cancel_form,
            submit_form,
            retry_form,
            bulk_form,
            priority_form,
            submit_page,
            box_page,
            drain_form,
            signin_page,
            signin,
            signout,
            stream,
            static,
        ],
    )
