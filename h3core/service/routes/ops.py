"""Operations: liveness, readiness, metrics, and the ceilings the console reads."""

from __future__ import annotations

from typing import cast

import anyio
from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec

from h3core.adapters.store.nodes import node_leases
from h3core.executors.base import Executor
from h3core.runtime.settings import Settings
from h3core.runtime.store_retry import StoreUnavailable
from h3core.service.auth import bearer_matches
from h3core.service.context import Service
from h3core.service.views import (
    AttentionRowView,
    CeilingsView,
    GroupView,
    HealthView,
    ModeView,
    ReadyStatus,
    ReadyView,
    ceilings_view,
    problems,
)


@get(
    "/healthz",
    summary="The process can do its job (liveness)",
    description="503 once it cannot (its runner, store tail or submissions failed, or the store failed past "
    "H3_STORE_RETRY): the process exits soon after, and a liveness probe should restart it if it does not.",
    sync_to_thread=False,
    responses={503: ResponseSpec(data_container=HealthView, description="it cannot, and why")},
)
def healthz(svc: NamedDependency[Service], request: Request) -> Response[HealthView]:
    """Liveness: 200 while the process can do its job, 503 once it cannot (`Service.health`), saying
    why to a caller with a token where tokens are set (the reason may name hosts). Read from memory:
    it answers while the store is down, which is for /readyz to say."""
    why = svc.health()
    if why is None:
        return Response(HealthView(status="ok"))
    if svc.settings.api_tokens and not bearer_matches(request.headers.get("authorization"), svc.settings.api_tokens):
        why = None
    return Response(HealthView(status="failing", reason=why), status_code=503)


@get(
    "/readyz",
    summary="The store is writable and the executor can run at least one mode",
    description="With API tokens set, a caller without a valid token is told the status only.",
    # A union of models: Litestar documents it, though its annotation of `data_container` leaves unions out.
    responses={
        503: ResponseSpec(data_container=ReadyView | ReadyStatus, description="not ready, and why"),  # type: ignore[arg-type]
    },
)
async def readyz(svc: NamedDependency[Service], request: Request) -> Response[ReadyView | ReadyStatus]:
    """`readiness`'s answer; with tokens set, a caller without a valid one is told the status only
    (`ReadyStatus`)."""
    answer = await readiness(svc)
    if svc.settings.api_tokens and not bearer_matches(request.headers.get("authorization"), svc.settings.api_tokens):
        return Response(ReadyStatus(status=answer.content.status), status_code=answer.status_code)
    return cast("Response[ReadyView | ReadyStatus]", answer)  # a `Response` is invariant in its content's type


async def readiness(svc: Service) -> Response[ReadyView]:
    """The readiness view, 200 when ready and 503 when not: ready is the store writable, the runner
    accepting and not draining (api role: a runner process or a node alive and not draining) and a
    mode the executor can run. The view says
    why not, and shows the modes, device groups, attention probe and runner nodes. Memory only: what
    lies outside it (the store, the runner lock, the nodes) comes from the last background look
    (`svc.readiness`, service/readiness.py), not checked by this request."""
    look = svc.readiness.now()
    checks: dict[str, str] = {}
    unusable = isinstance(svc.fatal, StoreUnavailable)
    checks["store"] = f"unusable: {svc.fatal}" if unusable else look.store
    caps = svc.contract.source()
    modes = [ModeView(mode=m.mode, served=m.served, ready=m.runnable, reason=m.reason) for m in caps.modes]
    problems = caps.problems()
    servable = caps.runnable_modes
    executor = f"ready for {', '.join(servable)}" if servable else "not ready: " + "; ".join(problems)
    groups = None
    runner = svc.runner
    if runner is None:  # the api role: the jobs run in another process: the runner lock's holder, or the nodes
        holder = look.runner
        if holder:
            runs = f"{holder} run the jobs" if holder.startswith("node ") else f"process {holder} runs the jobs"
        elif svc.readiness.runner_lock is None:
            drained = [n.node_id for n in look.nodes if n.alive and n.drain is not None]
            runs = (
                f"every live runner node is draining ({', '.join(drained)}): queued jobs wait until a drain is cleared"
                if drained
                else "no runner node alive (none beat within its lease: `h3core nodes`)"
            )
        else:
            runs = f"no runner process (nothing holds {svc.readiness.runner_lock})"
        checks["runner"] = runs if svc.submissions.accepting else "not accepting"
        ok = checks["store"] == "ok" and holder is not None and svc.submissions.accepting and bool(servable)
    else:
        drain = runner.heartbeat.drain if runner.heartbeat is not None else None
        checks["runner"] = "accepting" if svc.submissions.accepting else "not accepting"
        if drain is not None and svc.submissions.accepting:  # not ready: a balancer sends its work elsewhere
            by = f" by {drain.by}" if drain.by else ""
            checks["runner"] = f"draining since {drain.since.isoformat(timespec='seconds')}{by}: this node takes no new jobs"
        ok = checks["store"] == "ok" and bool(servable) and svc.submissions.accepting and drain is None
        health = runner.executor.health()
        groups = [GroupView.model_validate(h, from_attributes=True) for h in health] if health is not None else None
    attention = _attention(runner.executor) if runner is not None else None
    view = ReadyView(
        node=leases.node_id if (leases := node_leases(svc.store)) is not None else None,
        nodes=list(look.nodes) or None,
        status="ready" if ok else "not ready",
        executor=executor,
        modes=modes,
        problems=problems,
        groups=groups,
        attention=attention,
        **checks,
    )
    return Response(view, status_code=200 if ok else 503)


def _attention(executor: Executor) -> list[AttentionRowView] | None:
    """The executor's start-up attention probe (the pipeline's), else None."""
    report = executor.attention_report()
    return [AttentionRowView.model_validate(r, from_attributes=True) for r in report] if report is not None else None


@get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
async def metrics(svc: NamedDependency[Service]) -> bytes:
    """The Prometheus metrics, rendered on a worker thread (the store is read at scrape time)."""
    return await anyio.to_thread.run_sync(svc.metrics.render)


@get("/ceilings", summary="Frame limits per resolution and mode, from the code that judges submissions", responses=problems(401))
async def ceilings(svc: NamedDependency[Service]) -> CeilingsView:
    """The deployment's ceilings: the largest request of each shape admitted now, and the executor,
    profile and token budgets they follow from, by the contract that judges submissions."""
    return ceilings_view(svc.contract.current(), svc.contract.ceilings())


v1_handlers = [ceilings]  # under /v1, behind the token guard


def handlers_for(settings: Settings) -> list:
    """The unauthenticated routes; /metrics moves to its own listener with `metrics_port`."""
    return [healthz, readyz] + ([metrics] if settings.metrics_port is None else [])
