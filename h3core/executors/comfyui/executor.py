"""The ComfyUI executor: runs a job as a prompt on a ComfyUI (+ Raylight) server.

What the old adapter got wrong (docs/design.md §2) and how this one avoids it:
- completion came from one websocket message: here only /history decides, polled with backoff
  and checked at once when the socket says the prompt ended; a dropped socket only loses hints;
- the prompt id was the server's: here it is ours (derived from job and attempt, and the segment
  for a long video's: each segment is a prompt of its own), so after a restart h3core finds its
  prompt again and re-attaches instead of running it twice;
- `/interrupt` without a prompt id stops whatever runs: here it always names our prompt (sent
  once, then again on a backoff while the prompt still runs), and a pending prompt is deleted
  from the queue instead; a stop is certain: the queue is read again until ComfyUI no longer
  holds the prompt (a pending prompt may start between the read and the delete), for up to
  `stop_wait_s` (an interrupt lands only between nodes or at a sampler's steps: a prompt may run
  on for minutes), the job holding its slot meanwhile so that no other prompt is sent to a server
  still busy with it; past that the job fails `stop_unconfirmed`, never `cancelled` while the
  prompt may run; and a prompt that succeeded before the stop took effect keeps its video
  (`FinishedBeforeStop`: the job is done, the cancel too late), never thrown away and called
  cancelled;
- every prompt was sent at once and waited in ComfyUI's queue while h3core said `running`: here
  the executor states its `concurrency` and the runner starts no more, the rest wait in h3core;
- a stop of h3core interrupted the prompt: here it is left running (`on_stop="detach"`) and the
  next start re-attaches to it;
- a vanished prompt (ComfyUI restarted, history lost) is noticed within `lost_after_s`, and an
  unreachable server fails the attempt after `unreachable_after_s`: nothing waits forever; a
  server found down before the prompt was sent ends the attempt `not_started` at once (nothing
  ran: it costs the job no attempt, and the job waits queued until ComfyUI is back);
- progress is only what ComfyUI reports: a graph with no sampler counting the request's steps
  reports none.

A video longer than the model's window is made as segments where the fl2va mode is served (each
segment after the first continues from the frame the one before kept last, as fl2va's first
keyframe): each segment's prompt is one call, its video decoded and written as the segment file.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.backoff import Backoff, retry
from h3core.domain.capabilities import MODES, Capabilities, FrameWindow, ModeReadiness
from h3core.domain.events import Artifact, Progress
from h3core.domain.quality import QUALITIES
from h3core.domain.request import UPLOAD_MODES
from h3core.domain.segments import Segment
from h3core.executors.base import ExecutorFailure, FinishedBeforeStop, Heartbeat, JobSpec, NoReports, Result, Update
from h3core.executors.comfyui.client import ComfyClient, HistoryEntry, PromptRejected, Unreachable
from h3core.executors.comfyui.feed import LogTail, SocketFeed
from h3core.executors.comfyui.templates import Template, TemplateError, pick
from h3core.executors.reports import DeviceMemory

log = logging.getLogger("h3core.executors.comfyui")
T = TypeVar("T")

_PROMPTS = uuid.UUID("6c3e1d2a-8f4b-4a57-9a57-3f6f3f0b7c11")  # namespace of our prompt ids
VIDEO_SUFFIXES = (".mp4", ".webm", ".mkv", ".mov")
# A stop interrupts a running prompt once, then again after these pauses while it still runs
# (ComfyUI resets an interrupt that lands as the prompt starts). The queue is read every
# STOP_POLL_S for the first STOP_FAST_S (most stops take effect within it), then every poll_max_s.
INTERRUPT_AGAIN = Backoff(first_s=0.5, longest_s=4.0)
STOP_POLL_S = 0.1
STOP_FAST_S = 10.0


@dataclass(frozen=True)
class ComfyUISettings:
    """Where the ComfyUI server is and how the executor treats it: polling, the bounds on a lost or
    unreachable server and on a stop, its templates, how many prompts it runs at once, and what a stop
    of h3core does to running prompts."""

    url: str
    client_id: str
    topology: str = "single-gpu"
    poll_min_s: float = 0.5  # /history polling starts here and backs off
    poll_max_s: float = 5.0
    lost_after_s: float = 15.0  # in neither queue nor history for this long: executor_lost
    unreachable_after_s: float = 300.0  # server not answering for this long: executor_lost
    # A stop (a cancel, a stall, a deadline) follows the prompt until ComfyUI no longer holds it, for
    # at most this long, then fails the job `stop_unconfirmed`: an interrupt lands only between
    # nodes or at a sampler's steps, and until then the prompt runs (and may succeed: its video is kept).
    stop_wait_s: float = 600.0
    log_path: Path | None = None  # the server's log, for Raylight's progress
    templates: Mapping[str, str] = field(default_factory=dict)  # mode -> template name (default: the built-in)
    concurrency: int = 1  # prompts ComfyUI runs at once: h3core sends no more
    on_stop: Literal["detach", "interrupt"] = "detach"  # what a stop of h3core does to running prompts


def prompt_id_for(job_id: str, attempt: int, segment: int | None = None) -> str:
    """Ours, and the same after a restart: how a restarted h3core finds its prompt again. A long
    video's segments are a prompt each (`segment`: its index; None for a video made in one call)."""
    return str(uuid.uuid5(_PROMPTS, f"{job_id}:{attempt}" + ("" if segment is None else f":segment:{segment}")))


class ComfyUIExecutor(NoReports):
    """Runs each attempt as a prompt of ours on one ComfyUI server, built from the mode's template; the
    prompt outlives h3core (`Resumable`)."""

    name = "comfyui"

    def __init__(
        self,
        settings: ComfyUISettings,
        templates: dict[str, Template],
        artifacts: ArtifactStore,
        upload_path: Callable[[str], Path],
        *,
        client: ComfyClient | None = None,
    ) -> None:
        self.settings = settings
        self.templates = templates
        self.artifacts = artifacts
        self._upload_path = upload_path
        self.client = client or ComfyClient(settings.url)
        self.feed = SocketFeed(settings.url, settings.client_id)
        self._ready = False
        self._info: dict[str, Any] | None = None  # the server's /object_info, as last read
        self._info_connects = -1  # the socket connection it was read on
        self._detached: set[str] = set()  # prompts left running for the next start (h3core is stopping)
        self._sent: set[str] = set()  # prompts this process sent (or is sending) or follows: what may run on

    async def device_memory(self) -> tuple[DeviceMemory, ...] | None:
        """The devices ComfyUI's /system_stats reports: the driver's total and free, and what
        ComfyUI's torch holds (reserved less the free part of it). Raises `Unreachable` when the
        server does not answer."""
        devices = (await self.client.system_stats()).get("devices") or []
        found = tuple(
            DeviceMemory(
                name=str(d.get("name") or d.get("type") or "device"),
                total_bytes=int(d["vram_total"]),
                free_bytes=int(d["vram_free"]),
                held_bytes=int(d["torch_vram_total"]) - int(d["torch_vram_free"]) if "torch_vram_total" in d else None,
            )
            for d in devices
            if "vram_total" in d and "vram_free" in d
        )
        return found or None

    def capabilities(self) -> Capabilities:
        """Per mode: served when a template exists for it and the server (as last seen) has every
        node and input it uses; ready while the socket is up and the server's nodes are known."""
        s = self.settings
        connected = self._ready and self.feed.connected
        known = self._info is not None and self._info_connects == self.feed.connects
        modes, media, exact = [], {}, []
        levels = set(QUALITIES)  # the levels every served mode's template maps (`exact` always)
        window: FrameWindow | None = None
        served: set[str] = set()
        for mode in MODES:
            try:
                template = self._pick(mode)
            except TemplateError as exc:
                modes.append(ModeReadiness(mode=mode, served=False, ready=False, reason=str(exc)))
                continue
            missing = template.missing_on(self._info) if self._info is not None else []
            if not missing:
                levels &= {"exact", *template.qualities}
                served.add(mode)
            if missing:
                modes.append(ModeReadiness(mode=mode, served=False, ready=False, reason="; ".join(missing)))
            elif not self._ready:
                modes.append(ModeReadiness(mode=mode, ready=False, reason="not started"))
            elif not connected:
                modes.append(ModeReadiness(mode=mode, ready=False, reason=f"no connection to ComfyUI at {s.url}"))
            elif not known:
                modes.append(ModeReadiness(mode=mode, ready=False, reason=f"reading the nodes of ComfyUI at {s.url}"))
            else:
                modes.append(ModeReadiness(mode=mode))
            for name, owner in UPLOAD_MODES.items():
                if owner == mode:
                    media[name] = len(template.media.get(name, ()))
            if template.frames == "exact":
                exact.append(mode)
            if self._info is not None and not missing:
                # One window for every mode: the range all the graphs in service take (the built-in
                # ones bind frames to the same kind of node).
                least, most, where = template.value_range(self._info, "frames")
                if least is not None or most is not None:
                    if window is not None:
                        least = max(least or 1, window.least)
                        most = most if window.most is None else window.most if most is None else min(most, window.most)
                        where = window.source.removesuffix(" on the server") + (
                            f", {where}" if where not in window.source else ""
                        )
                    window = FrameWindow(least=max(1, least or 1), most=most, source=f"{where} on the server")
        return Capabilities(
            executor=self.name,
            hardware=f"ComfyUI at {s.url}",
            model="minimax-h3",
            topology=s.topology,
            modes=tuple(modes),
            media=media,
            window=window,
            concurrency=s.concurrency,
            stop_wait_s=s.stop_wait_s,  # the runner waits for a stopped prompt's end this long
            exact_frames=tuple(exact),
            qualities=tuple(q for q in QUALITIES if q in levels),
            # Each segment after the first continues from the frame the one before kept last: fl2va's.
            continues_segments="fl2va" in served,
        )

    def check(self, job: JobSpec) -> None:
        """The mode's template must exist, have every node it uses on the server (as last read), take the
        job's frames and build a graph from the request."""
        template = self._template(job)
        if self._info is not None and (missing := template.missing_on(self._info)):
            raise ExecutorFailure("invalid", f"ComfyUI at {self.settings.url} cannot run {template.name}: {'; '.join(missing)}")
        # The one window admission applies is what all the graphs in service take (their nodes'
        # ranges together): a job outside it is refused here too, whichever mode it is.
        window = self.capabilities().window
        if window is not None and not window.admits(job.request.frames):
            raise ExecutorFailure("invalid", f"frames: {job.request.frames} is outside {window.describe()}")
        placeholders = {upload_id: f"h3-{upload_id}" for ids in job.request.uploads().values() for upload_id in ids}
        try:
            template.build(job.request, placeholders)
        except TemplateError as exc:
            raise ExecutorFailure("invalid", str(exc)) from exc

    async def _check_nodes(self) -> None:
        """Read the server's nodes each time the socket (re)connects: a template whose node or
        input is missing takes its mode out of service, visibly, instead of failing a job."""
        while True:
            if self.feed.connected and self.feed.connects != self._info_connects:
                connects = self.feed.connects
                try:
                    info = await self.client.object_info()
                except Unreachable:
                    await anyio.sleep(1.0)
                    continue
                self._info, self._info_connects = info, connects
            await anyio.sleep(1.0)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Keep the websocket up and read the server's nodes on each (re)connection; on exit stop both and
        close the HTTP client."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.feed.run)
            tg.start_soon(self._check_nodes)
            self._ready = True
            try:
                yield
            finally:
                self._ready = False
                tg.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await self.client.aclose()

    def reference(self, job: JobSpec) -> str:
        """The prompt id of the attempt's call (`prompt_id_for`): of its segment, for a long video's."""
        return prompt_id_for(job.job_id, job.attempt, None if job.segment is None else job.segment.index)

    def info(self, job: JobSpec) -> dict[str, str]:
        """The template, the server, the request fields the template ignores, and the quality level with
        the inputs the template sets for it."""
        t = self._template(job)
        level = job.request.quality
        out = {"template": t.name, "comfyui": self.settings.url, "quality": level}
        if t.ignores:
            out["ignores"] = ",".join(t.ignores)  # request fields this graph does not use, in the log
        if settings := t.qualities.get(level):
            out["cache"] = "template sets " + ", ".join(f"{s.node}.{s.input}={s.value!r}" for s in settings)
        return out

    def _pick(self, mode: str) -> Template:
        return pick(self.templates, mode, self.settings.topology, self.settings.templates)

    def _template(self, job: JobSpec) -> Template:
        try:
            return self._pick(job.request.mode)
        except TemplateError as exc:
            raise ExecutorFailure("invalid", str(exc)) from exc

    # -- a job ------------------------------------------------------------------------------

    def run(self, job: JobSpec) -> AsyncIterator[Update]:
        """Upload the job's media, submit its prompt and follow it to its end in /history; a cancel stops
        the prompt (or leaves it running, when detached)."""
        return self._stopping_if_abandoned(job, self.reference(job), self._submit_and_follow(job))

    def resume(self, job: JobSpec, executor_ref: str) -> AsyncIterator[Update]:
        """Follow a prompt a previous h3core process submitted (its id is ours, so we know it): the
        segment's, for a long video's (`executor_ref`, the attempt's, names its first call's)."""
        prompt_id = self._prompt_of(job, executor_ref)
        self._sent.add(prompt_id)
        return self._stopping_if_abandoned(job, prompt_id, self._follow(job, self._template(job), prompt_id))

    def detach(self, job: JobSpec, executor_ref: str) -> bool:
        """h3core is stopping: leave the prompt running for the next start (`on_stop="detach"`). A
        prompt not sent yet (its uploads under way, or a long video between two segments) runs
        nowhere: the attempt is handed back, not left for the next start to look for in vain."""
        prompt_id = self._prompt_of(job, executor_ref)
        if self.settings.on_stop != "detach" or prompt_id not in self._sent:
            return False
        self._detached.add(prompt_id)
        return True

    def _prompt_of(self, job: JobSpec, executor_ref: str) -> str:
        """The prompt of the call `job` is: the attempt's (`executor_ref`), or its segment's."""
        return executor_ref if job.segment is None else self.reference(job)

    async def _stopping_if_abandoned(
        self, job: JobSpec, prompt_id: str, updates: AsyncGenerator[Update, None]
    ) -> AsyncIterator[Update]:
        """Pass `updates` on; if they are not followed to the end, make sure the prompt stops (following
        it until ComfyUI no longer holds it), and keep its video if it had succeeded before the stop
        took effect."""
        try:
            async with aclosing(updates):
                async for update in updates:
                    yield update
        except ExecutorFailure as exc:
            if exc.kind != "not_started":  # not_started: ComfyUI has nothing of the job to stop
                with anyio.CancelScope(shield=True):
                    # The failure is what is reported: a ComfyUI that does not answer is not waited for.
                    await self._stop(prompt_id, patience_s=0.0)
            raise
        except Exception:  # our own failure: stop what may still run, and report the failure
            with anyio.CancelScope(shield=True):
                await self._stop(prompt_id, patience_s=0.0)
            raise
        except BaseException:  # cancelled (or closed) by the runner
            if prompt_id in self._detached:
                self._detached.discard(prompt_id)
                raise  # left running: the next start resumes it
            with anyio.CancelScope(shield=True):
                unconfirmed = await self._stop(prompt_id)
                finished = await self._finished_anyway(job, prompt_id) if unconfirmed is None else None
            if unconfirmed is not None:
                raise ExecutorFailure("stop_unconfirmed", f"ComfyUI may still run prompt {prompt_id}: {unconfirmed}") from None
            if finished is not None:
                raise FinishedBeforeStop(finished) from None
            raise
        finally:
            self._sent.discard(prompt_id)

    async def _finished_anyway(self, job: JobSpec, prompt_id: str) -> Result | None:
        """Once ComfyUI no longer holds a prompt that was being stopped: its video, if it had
        succeeded before the stop took effect (else None: it was interrupted, deleted, or failed)."""
        try:
            entry = await self.client.history(prompt_id)
        except Unreachable as exc:
            log.warning(
                "prompt %s left ComfyUI's queue, but its history could not be read (%s): taken as stopped",
                prompt_id,
                exc,
                extra={**_where(job), "prompt_id": prompt_id, "error": str(exc)},
            )
            return None
        if entry is None or entry.status != "success":
            return None
        log.info(
            "prompt %s had succeeded before the stop took effect: its video is kept",
            prompt_id,
            extra={**_where(job), "prompt_id": prompt_id},
        )
        return await self._finish(job, self._template(job), prompt_id, entry)

    async def _submit_and_follow(self, job: JobSpec) -> AsyncGenerator[Update, None]:
        template = self._template(job)
        prompt_id = self.reference(job)
        yield Heartbeat("uploading")
        uploaded = await self._patiently(lambda: self._upload(job), unsent=True)
        try:
            graph = template.build(job.request, uploaded)
        except TemplateError as exc:
            raise ExecutorFailure("invalid", str(exc)) from exc
        self._sent.add(prompt_id)  # from here on it may run in ComfyUI (the POST may land, answered or not)
        try:
            await self._patiently(lambda: self._submit(prompt_id, graph), unsent=True)
        except PromptRejected as exc:
            raise ExecutorFailure("invalid", _rejection(exc.body, template), str(exc.body)[:2000]) from exc
        async for update in self._follow(job, template, prompt_id):
            yield update

    async def _submit(self, prompt_id: str, graph: dict[str, Any]) -> None:
        # Shielded: a cancel never lands while the POST is in flight, when ComfyUI may or may not
        # have queued the prompt; after it, `_stop` finds the prompt wherever it is.
        with anyio.CancelScope(shield=True):
            await self.client.submit(prompt_id, graph, self.settings.client_id)

    async def _upload(self, job: JobSpec) -> dict[str, str]:
        names: dict[str, str] = {}
        for ids in job.request.uploads().values():
            for upload_id in ids:
                if upload_id not in names:
                    path = self._upload_path(upload_id)
                    names[upload_id] = await self.client.upload(path, f"h3-{upload_id}{path.suffix}")
        return names

    async def _patiently(
        self, call: Callable[[], Awaitable[T]], *, job: JobSpec | None = None, prompt_id: str = "", unsent: bool = False
    ) -> T:
        """Call until ComfyUI answers; fail the attempt once it has been unreachable for
        `unreachable_after_s` (`executor_lost`). Said once per outage; when following a prompt,
        its end said too. `unsent`: ComfyUI has nothing of the job yet (its uploads, the POST of its
        prompt): once ComfyUI is seen down too (its socket dropped), or past the bound, the attempt
        ends `not_started` (nothing ran), unless a request may have reached ComfyUI."""
        s = self.settings
        where = {**_where(job), "prompt_id": prompt_id} if job is not None else {}
        outage = False
        reached = False  # a failed request may have reached ComfyUI (a timeout, a dropped answer)

        def keep_trying(exc: Exception) -> bool:
            return isinstance(exc, Unreachable) and (not unsent or reached or exc.sent or self.feed.connected)

        def unreachable(exc: Exception, tries: int, pause: float) -> None:
            nonlocal outage, reached
            outage = True
            reached = reached or (isinstance(exc, Unreachable) and exc.sent)
            if tries > 1:
                return  # said once per outage, not per try
            if job is None:
                log.warning("ComfyUI unreachable (%s); retrying for %gs", exc, s.unreachable_after_s, extra={"error": str(exc)})
            else:
                log.warning(
                    "ComfyUI unreachable while following prompt %s (%s); retrying for %gs",
                    prompt_id,
                    exc,
                    s.unreachable_after_s,
                    extra={**where, "error": str(exc)},
                )

        def lost(exc: Exception, tries: int) -> ExecutorFailure:
            if unsent and not (reached or (isinstance(exc, Unreachable) and exc.sent)):
                return ExecutorFailure("not_started", f"ComfyUI at {s.url} is unreachable; the job was not sent to it: {exc}")
            return ExecutorFailure("executor_lost", f"ComfyUI unreachable for {s.unreachable_after_s:g}s: {exc}")

        try:
            answer = await retry(
                call,
                Backoff(s.poll_min_s, s.poll_max_s, s.unreachable_after_s),
                retry_if=keep_trying,
                on_retry=unreachable,
                give_up=lost,
            )
        except Unreachable as exc:  # not tried again: ComfyUI is down and holds nothing of the job
            raise lost(exc, 0) from exc
        if outage and job is not None:
            log.info("ComfyUI answers again (prompt %s)", prompt_id, extra=where)
        return answer

    async def _follow(self, job: JobSpec, template: Template, prompt_id: str) -> AsyncGenerator[Update, None]:
        s = self.settings
        steps = job.request.steps
        last_step = job.last_step
        # Progress is what ComfyUI reports of a node counting the request's steps; a graph with
        # none (a model-free demo graph, a sampler with its own step count) reports none.
        counts_steps = template.sampler is not None and "steps" in template.values
        tail = LogTail(s.log_path, template.progress.log_pattern) if template.progress.source == "log" and s.log_path else None
        delay = s.poll_min_s
        vanished_since: float | None = None
        next_poll = anyio.current_time()
        reported = last_step > 0  # the sampler reported a step on this attempt (before a restart, too)
        async with self.feed.follow(prompt_id) as hints:
            while True:
                # Wait for a hint or the poll timer; decide outside the scope (never yield in it).
                step, ended, heard = None, False, False
                with anyio.move_on_after(delay):
                    message = await hints.receive()
                    heard = True
                    kind, data = message.get("type"), message.get("data") or {}
                    if (
                        kind == "progress"
                        and template.sampler is not None
                        and str(data.get("node")) == template.sampler
                        and data.get("max") == steps
                    ):
                        step = int(data.get("value", 0))
                    elif _ends(message):
                        ended = True
                if tail is not None:
                    seen = tail.progress(steps)
                    step = max(step or 0, seen or 0) or None
                if step is not None and step > last_step:
                    last_step, reported = step, True
                    yield Progress(step=step, total=steps)
                elif heard:
                    yield Heartbeat("comfyui")
                if heard and not ended and anyio.current_time() < next_poll:
                    continue  # hints come in bursts: read them, but poll at least every poll_max_s
                # Poll the authority (through an outage: `_patiently`, which fails the attempt past its bound).
                next_poll = anyio.current_time() + s.poll_max_s
                entry, running, pending = await self._patiently(lambda: self._poll(prompt_id), job=job, prompt_id=prompt_id)
                if entry is not None:
                    result = await self._finish(job, template, prompt_id, entry)
                    if last_step < steps and entry.status == "success" and counts_steps and reported:
                        # The socket missed the last steps; the success ComfyUI reports is the sampler's too.
                        # A sampler that reported no step reports none here either: no progress is made up.
                        yield Progress(step=steps, total=steps)
                    yield result
                    return
                if prompt_id in running or prompt_id in pending:
                    vanished_since = None
                    yield Heartbeat("running" if prompt_id in running else "queued")
                else:
                    # Not queued, not running, not finished: gone. The window covers the moment
                    # between leaving the queue and reaching history.
                    now = anyio.current_time()
                    vanished_since = vanished_since or now
                    if now - vanished_since >= s.lost_after_s:
                        raise ExecutorFailure(
                            "executor_lost",
                            f"prompt {prompt_id} is in neither ComfyUI's queue nor its history "
                            f"(ComfyUI restarted?) for {s.lost_after_s:g}s",
                        )
                delay = s.poll_min_s if (ended or tail is not None) else min(delay * 2, s.poll_max_s)

    async def _poll(self, prompt_id: str) -> tuple[HistoryEntry | None, set[str], set[str]]:
        """The prompt's history entry, or (when it has none yet) the running and pending prompt ids."""
        entry = await self.client.history(prompt_id)
        if entry is not None:
            return entry, set(), set()
        running, pending = await self.client.queue()
        return None, running, pending

    async def _finish(self, job: JobSpec, template: Template, prompt_id: str, entry: HistoryEntry) -> Result:
        if entry.status != "success":
            raise _failure(entry)
        ref = _video_output(entry.outputs.get(template.output) or {})
        if ref is None:
            raise ExecutorFailure(
                "executor_error",
                f"prompt {prompt_id} succeeded but output node {template.output} named no video",
                str(entry.outputs)[:2000],
            )
        suffix = Path(ref["filename"]).suffix or ".mp4"
        staged = self.artifacts.staging(job.job_id, job.attempt, suffix if job.segment is None else f".comfyui{suffix}")
        try:
            await self._patiently(lambda: self.client.download(ref, staged))
        except Exception:
            with anyio.CancelScope(shield=True):
                await anyio.Path(staged).unlink(missing_ok=True)
            raise
        if job.segment is not None:
            return Result(await self._save_segment(job, job.segment, staged))
        frames, seconds = await anyio.to_thread.run_sync(_measure, staged)
        artifact = self.artifacts.commit(staged, job_id=job.job_id, attempt=job.attempt, frames=frames, duration_s=seconds)
        return Result(artifact)

    async def _save_segment(self, job: JobSpec, segment: Segment, downloaded: Path) -> Artifact:
        """ComfyUI's video of the segment's call written as the segment file and stored; the download removed."""
        fps = job.request.fps
        staged = self.artifacts.staging(job.job_id, job.attempt, ".mp4")

        def save() -> Artifact:
            from h3core.adapters.segment_files import ShortVideo, segment_from_video

            try:
                segment_from_video(downloaded, staged, segment, fps=fps)
            except ShortVideo as short:
                staged.unlink(missing_ok=True)
                raise ExecutorFailure("executor_error", f"ComfyUI made {short.made} frames, {short.asked} asked") from None
            except Exception:
                staged.unlink(missing_ok=True)
                raise
            finally:
                downloaded.unlink(missing_ok=True)
            keep = segment.keep
            return self.artifacts.put_segment(
                staged, job_id=job.job_id, attempt=job.attempt, index=segment.index, frames=keep, duration_s=keep / fps
            )

        return await anyio.to_thread.run_sync(save)

    async def _stop(self, prompt_id: str, *, patience_s: float | None = None) -> str | None:
        """Make sure ComfyUI no longer holds the prompt: None once it is in neither queue, else why
        that was not seen within `stop_wait_s` (or while ComfyUI did not answer for `patience_s`,
        by default `unreachable_after_s`). Pending: delete it, then look again (it may have started
        between the read and the delete). Running: interrupt it by id once, and again on
        `INTERRUPT_AGAIN`'s pauses while it still runs (an interrupt that lands as the prompt starts
        is reset by ComfyUI). The queue is read again at once when the socket says the prompt ended."""
        s = self.settings
        patience_s = s.unreachable_after_s if patience_s is None else patience_s
        began = anyio.current_time()
        why = f"it was still in ComfyUI's queue after {s.stop_wait_s:g}s"
        interrupts = 0
        next_interrupt = -math.inf
        unanswered_since: float | None = None
        async with self.feed.follow(prompt_id) as hints:
            with anyio.move_on_after(s.stop_wait_s):
                while True:
                    now = anyio.current_time()
                    try:
                        running, pending = await self.client.queue()
                        unanswered_since = None
                        if prompt_id in pending:
                            await self.client.delete(prompt_id)
                            continue
                        if prompt_id not in running:
                            return None  # ended, deleted, or never queued: ComfyUI does not run it
                        if now >= next_interrupt:
                            await self.client.interrupt(prompt_id)
                            interrupts += 1
                            next_interrupt = anyio.current_time() + INTERRUPT_AGAIN.pause(interrupts)
                            if interrupts == 2:  # the first did not take: say why the job keeps its slot
                                log.info(
                                    "prompt %s still runs after an interrupt; following it until ComfyUI no longer "
                                    "holds it (at most %gs), its job holding its slot meanwhile",
                                    prompt_id,
                                    s.stop_wait_s,
                                    extra={"prompt_id": prompt_id, "executor": "comfyui"},
                                )
                        why = f"it was still running after {s.stop_wait_s:g}s (interrupted by id {interrupts}x)"
                    except Unreachable as exc:
                        unanswered_since = now if unanswered_since is None else unanswered_since
                        why = f"ComfyUI did not answer for {min(s.stop_wait_s, patience_s):g}s ({exc})"
                        if now - unanswered_since >= patience_s:
                            return why
                    with anyio.move_on_after(STOP_POLL_S if now - began < STOP_FAST_S else s.poll_max_s):
                        await _until_ended(hints)
        return why


def _ends(message: Mapping[str, Any]) -> bool:
    """Whether a socket message says its prompt ended (a hint: /history and the queue decide)."""
    kind, data = message.get("type"), message.get("data") or {}
    return kind in ("execution_success", "execution_error", "execution_interrupted") or (
        kind == "executing" and data.get("node") is None
    )


async def _until_ended(hints: AsyncIterator[Mapping[str, Any]]) -> None:
    """Until the socket says the prompt ended."""
    async for message in hints:
        if _ends(message):
            return
    await anyio.sleep_forever()  # the feed closed: only the caller's timer wakes it


def _where(job: JobSpec) -> dict[str, Any]:
    return {"job_id": job.job_id, "attempt": job.attempt, "executor": "comfyui"}


def _rejection(body: dict[str, Any], template: Template) -> str:
    error = body.get("error") or {}
    parts = [f"ComfyUI refused the {template.name} workflow: {error.get('message', 'invalid prompt')}".rstrip()]
    if error.get("details"):
        parts[0] += f" ({error['details']})"
    for node_id, node in (body.get("node_errors") or {}).items():
        for e in node.get("errors", []):
            details = str(e.get("details") or "")
            name = (e.get("extra_info") or {}).get("input_name") or details
            text = f"node {node_id} ({node.get('class_type')}) input {name!r}: {e.get('message')}"
            # ComfyUI's details are often just the input's name again ("width"): say it once.
            parts.append(text + (f" ({details})" if details and details != name else ""))
    return "; ".join(parts)


def _failure(entry: HistoryEntry) -> ExecutorFailure:
    error = entry.last("execution_error")
    if error is not None:
        etype, message = str(error.get("exception_type", "")), str(error.get("exception_message", "")).strip()
        where = f"{error.get('node_type')} node {error.get('node_id')}"
        detail = "".join(error.get("traceback") or [])[-4000:] or None
        if "OutOfMemoryError" in etype or "out of memory" in message.lower():
            return ExecutorFailure("oom", f"out of memory in {where}: {message}"[:2000], detail)
        return ExecutorFailure("executor_error", f"{etype} in {where}: {message}"[:2000], detail)
    interrupted = entry.last("execution_interrupted")
    if interrupted is not None:
        return ExecutorFailure(
            "executor_error",
            f"the prompt was interrupted on the ComfyUI server (not by h3core) in node {interrupted.get('node_id')}",
        )
    return ExecutorFailure("executor_error", f"ComfyUI reports status {entry.status!r} without an error message")


def _video_output(output: dict[str, Any]) -> dict[str, Any] | None:
    for key in ("images", "gifs", "videos"):
        for item in output.get(key) or []:
            if isinstance(item, dict) and str(item.get("filename", "")).lower().endswith(VIDEO_SUFFIXES):
                return item
    return None


def _measure(path: Path) -> tuple[int, float]:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = stream.frames or sum(1 for _ in container.decode(video=0))
        seconds = float(container.duration / 1_000_000) if container.duration else frames / 24
    return frames, seconds
