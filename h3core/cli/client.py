"""Client commands that talk to a running `h3core serve`: `submit [--watch]` and `cancel`.

They need the `client` extra (httpx), imported when a command runs: `import h3core.cli` does not.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from h3core.cli.app import app
from h3core.cli.common import EXIT_DATA, EXIT_USAGE, console, console_err, fail, require_extra
from h3core.domain.segments import SegmentPlan, steps_done
from h3core.domain.story import segment_words

if TYPE_CHECKING:
    import httpx

UrlOption = Annotated[str, typer.Option("--url", envvar="H3_URL", help="The h3core service.")]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="H3_TOKEN", help="A bearer token, if the service requires one.", show_default=False),
]


def http(url: str, token: str | None, timeout: float = 30.0) -> httpx.Client:
    """An HTTP client for the service at `url`, sending `token` as a bearer token if given. Exits 2
    naming the `client` extra if httpx is not installed."""
    require_extra("client", "httpx", "httpx_sse")
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)


def _problem(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    text = f"HTTP {response.status_code}: {body.get('detail', body)}"
    for e in body.get("errors") or []:
        text += f"\n  {e.get('field')}: {e.get('message')}"
    if body.get("ceiling"):
        c = body["ceiling"]
        text += f"\n  ceiling: {c['max_frames']} frames ({c['reason']}{'' if c.get('verified', True) else ', unverified'})"
    return text


def _request(client: httpx.Client, method: str, path: str, **kw) -> httpx.Response:
    import httpx

    try:
        return client.request(method, path, **kw)
    except httpx.HTTPError as exc:
        fail(f"cannot reach {client.base_url}: {exc}")


# A stream that drops (a restart of the service, a proxy's idle cut) is followed again from the
# last event seen (Last-Event-ID) after these pauses; the job goes on in the service meanwhile.
RECONNECT_PAUSES_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
TERMINAL = ("done", "failed", "cancelled")


# The pages of GET /v1/jobs a short id is looked for in (newest first): 20,000 jobs.
ID_SEARCH_PAGES, ID_SEARCH_PAGE = 40, 500


def _whole_id(client: httpx.Client, given: str) -> str:
    """The job id `given` starts, where it is the start of exactly one (newest jobs first);
    a whole id, or one that starts none, as given (the service then answers for it)."""
    if len(given) >= 32 or not given or not all(c in "0123456789abcdef" for c in given):
        return given
    found: list[str] = []
    cursor: str | None = None
    for _ in range(ID_SEARCH_PAGES):
        params = {"limit": ID_SEARCH_PAGE, **({"cursor": cursor} if cursor else {})}
        page = _request(client, "GET", "/v1/jobs", params=params)
        if page.status_code != 200:
            fail(_problem(page), EXIT_USAGE)
        body = page.json()
        found += [item["id"] for item in body["items"] if item["id"].startswith(given)]
        cursor = body.get("next_cursor")
        if len(found) > 1 or not cursor:
            break
    if len(found) > 1:
        fail(f"{given} starts more than one job ({', '.join(found[:3])}, ...): give more of its id", EXIT_USAGE)
    return found[0] if found else given


def log_event(data: str) -> dict | None:
    """The job's event an SSE message carries; None for anything else: a keep-alive (a comment,
    which httpx-sse hands over as a message with no data) or data that is not an event."""
    if not data.strip():
        return None
    try:
        event = json.loads(data)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("body"), dict) else None


def watch(client: httpx.Client, job_id: str) -> dict:
    """Follow a job's event stream with a progress bar until its terminal event; return its final
    view. Keep-alives are skipped; a dropped stream is followed again from the last event seen."""
    import httpx
    from httpx_sse import connect_sse

    out = console()
    last: str | None = None  # the id of the last event shown: where a new connection starts
    lost = 0  # connections lost in a row, without an event between them
    seen = _Seen()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=out) as bar:
        task = bar.add_task(f"{job_id[:12]} queued", total=None)
        while True:
            headers = {"Last-Event-ID": last} if last is not None else {}
            try:
                with connect_sse(
                    client, "GET", f"/v1/jobs/{job_id}/stream", headers=headers, timeout=httpx.Timeout(30.0, read=None)
                ) as source:
                    status = source.response.status_code
                    if status == 204:  # the job has ended, with nothing after `last`
                        break
                    if status != 200 and status < 500:
                        fail(_problem(source.response))
                    why = f"HTTP {status}"
                    if status == 200:
                        for sse in source.iter_sse():
                            event = log_event(sse.data)
                            if event is None:
                                continue
                            last, lost = sse.id or last, 0
                            if _show(bar, task, job_id, event["body"], seen):
                                return _request(client, "GET", f"/v1/jobs/{job_id}").json()
                        why = "the service ended the stream before the job ended"
            except httpx.HTTPError as exc:
                why = str(exc) or type(exc).__name__
            if lost == len(RECONNECT_PAUSES_S):
                fail(f"lost the event stream of {job_id}: {why} (the job goes on; watch it again with `h3core submit --watch`)")
            bar.console.print(
                f"event stream of {job_id} lost ({why}); following it again" + (f" after event #{last}" if last else "")
            )
            time.sleep(RECONNECT_PAUSES_S[lost])
            lost += 1
    return _request(client, "GET", f"/v1/jobs/{job_id}").json()


@dataclass
class _Seen:
    """What the watch has read of the job so far that later events are counted by: the steps of
    each call (the request's), the attempt, and for a long video its segments, in all and made."""

    per: int | None = None
    of: int | None = None
    made: int = 0
    attempt: int = 0

    def running(self, job_id: str) -> str:
        """The bar's words while an attempt runs ("0123456789ab running (attempt 1, segment 2 of 3)")."""
        where = f", {segment_words(self.made, self.of)}" if self.of is not None else ""
        return f"{job_id[:12]} running (attempt {self.attempt}{where})"

    def done(self, step: int | None, total: int | None) -> int:
        """The whole job's steps done: a long video's are every segment's."""
        if self.of is None:
            return step or 0
        return steps_done(self.per or total or 0, self.made, step, total) or 0

    def total(self, total: int | None) -> int | None:
        """The whole job's steps (None: not known yet)."""
        per = self.per or total
        return per * self.of if self.of is not None and per else total


def _plan_words(plan: dict, count: int) -> str:
    """A plan as the service sent it, in words; its count alone where it does not read as one
    (a service newer than this client)."""
    try:
        return SegmentPlan.model_validate(plan).describe()
    except ValidationError:
        return f"{count} segments"


def _show(bar: Progress, task: TaskID, job_id: str, body: dict, seen: _Seen) -> bool:
    """Show one event on the bar, its steps those of the whole job (`seen` keeps what that needs
    from the events before); True for the job's terminal one."""
    kind = body.get("type")
    if kind == "submitted" and isinstance(body.get("request"), dict):
        seen.per = body["request"].get("steps")
    elif kind == "planned":
        seen.of = len(body["plan"]["segments"])
        bar.update(task, total=seen.total(None))
        bar.console.print(f"a long video, made as {_plan_words(body['plan'], seen.of)}")
    elif kind == "running":
        seen.attempt = body["attempt"]
        bar.update(task, description=seen.running(job_id), completed=seen.done(None, None))
    elif kind == "progress":
        bar.update(task, total=seen.total(body["total"]), completed=seen.done(body["step"], body["total"]))
    elif kind == "segment_done":
        seen.made = body["index"] + 1
        bar.update(task, description=seen.running(job_id), completed=seen.done(None, None))
        bar.console.print(f"segment {seen.made} of {seen.of} made")
    elif kind == "attempt_failed":
        bar.console.print(f"attempt {body['attempt']} failed ({body['kind']}: {body['message']}); it will be retried")
    elif kind in TERMINAL:
        bar.update(task, description=f"{job_id[:12]} {kind}")
        return True
    return False


@app.command()
def submit(
    prompt: Annotated[str, typer.Option("--prompt", help="What to generate.")],
    url: UrlOption = "http://127.0.0.1:8100",
    token: TokenOption = None,
    mode: Annotated[str, typer.Option(help="t2va, fl2va or ref2va.")] = "t2va",
    width: Annotated[int, typer.Option(help="A multiple of 32.")] = 1344,
    height: Annotated[int, typer.Option(help="A multiple of 32.")] = 768,
    frames: Annotated[int, typer.Option(help="Frames at 24 fps.")] = 124,
    steps: Annotated[int, typer.Option(help="Denoising steps.")] = 50,
    seed: Annotated[int, typer.Option()] = 0,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    quality: Annotated[
        str, typer.Option(help="exact (every step computed), balanced or fast (steps served from a cache: faster, lossy).")
    ] = "exact",
    first: Annotated[str | None, typer.Option(help="fl2va: upload id of the first frame.")] = None,
    last: Annotated[str | None, typer.Option(help="fl2va: upload id of the last frame.")] = None,
    image: Annotated[list[str] | None, typer.Option(help="ref2va: upload id of a reference image (repeatable).")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Resubmitting with the same key returns the same job.")] = None,
    wait: Annotated[bool, typer.Option("--watch", help="Follow the job with a progress bar until it ends.")] = False,
    download: Annotated[Path | None, typer.Option(help="With --watch: save the video here.")] = None,
) -> None:
    """Submit a job to the service; with --watch, follow it live and say where the video is."""
    body: dict = {
        "prompt": prompt,
        "mode": mode,
        "width": width,
        "height": height,
        "frames": frames,
        "steps": steps,
        "seed": seed,
        "priority": priority,
    }
    if quality != "exact":  # sent only when asked: a service older than the field refuses it
        body["quality"] = quality
    if first or last:
        body["keyframes"] = {k: v for k, v in (("first", first), ("last", last)) if v}
    if image:
        body["references"] = {"images": image}
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    with http(url, token) as client:
        response = _request(client, "POST", "/v1/jobs", json=body, headers=headers)
        if response.status_code not in (200, 201):
            fail(_problem(response), EXIT_USAGE if response.status_code < 500 else EXIT_DATA)
        job = response.json()
        for w in job.get("warnings", []):
            console_err().print(f"warning: {w}")
        console().print(
            f"job {job['id']} {job['status']}"
            + (f" (queue position {job['queue_position']})" if job.get("queue_position") else "")
        )
        if not wait:
            return
        job = watch(client, job["id"])
        out = console()
        if job["status"] != "done":
            err = job.get("error") or {}
            out.print(f"job {job['id']} {job['status']}" + (f": {err.get('kind')}: {err.get('message')}" if err else ""))
            out.print(f"why: h3core replay {job['id']}")
            raise typer.Exit(EXIT_DATA)
        art = job["artifact"]
        out.print(
            f"done in {job['elapsed_seconds']:.1f}s: {client.base_url}{art['url']} ({art['bytes']} bytes, sha256 {art['sha256']})"
        )
        if download is not None:
            with client.stream("GET", art["url"]) as r, open(download, "wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
            out.print(f"saved {download}")


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="The job to cancel: its id, or the start of one (as `submit --watch` shows).")],
    url: UrlOption = "http://127.0.0.1:8100",
    token: TokenOption = None,
) -> None:
    """Cancel a job: a queued one ends at once, a running one once its executor stops."""
    with http(url, token) as client:
        job_id = _whole_id(client, job_id)
        response = _request(client, "POST", f"/v1/jobs/{job_id}/cancel")
    if response.status_code != 202:
        fail(_problem(response), EXIT_USAGE)
    job = response.json()
    console().print(f"job {job_id}: {'cancel requested' if job['status'] == 'running' else job['status']}")
