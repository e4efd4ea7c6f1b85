"""Operations: liveness, readiness, metrics, and the ceilings the console reads."""

from __future__ import annotations

import anyio
from litestar import Response, get
from litestar.openapi.datastructures import ResponseSpec

from h3core.adapters.lock import RunnerLock, runner_lock_path
from h3core.service.context import Service
from h3core.service.views import AttentionRowView, CeilingsView, GroupView, ReadyView, ceiling_view, problems


@get("/healthz", summary="The process is up", sync_to_thread=False)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", summary="The store is writable and the executor ready", responses={503: ResponseSpec(data_container=ReadyView, description="not ready, and why")})
async def readyz(svc: Service) -> Response[ReadyView]:
    checks: dict[str, str] = {}
    try:
        await anyio.to_thread.run_sync(svc.store.ping)
        checks["store"] = "ok"
    except Exception as exc:  # any failure to write means not ready; report it, do not crash
        checks["store"] = f"not writable: {exc}"
    if svc.tail is not None:  # api role: the jobs run in the process holding the runner lock
        lock = runner_lock_path(svc.settings.db)
        holder = await anyio.to_thread.run_sync(RunnerLock.holder, lock)
        checks["executor"] = f"in the runner process ({svc.settings.executor})"
        running = f"process {holder} runs the jobs" if holder else f"no runner process (nothing holds {lock})"
        checks["runner"] = running if svc.runner.accepting else "not accepting"
        ok = checks["store"] == "ok" and holder is not None and svc.runner.accepting
        return Response(ReadyView(status="ready" if ok else "not ready", **checks), status_code=200 if ok else 503)
    executor = svc.runner.executor
    reason = getattr(executor, "not_ready_reason", None)
    checks["executor"] = "ready" if executor.ready else f"not ready: {reason}" if reason else "not ready"
    checks["runner"] = "accepting" if svc.runner.accepting else "not accepting"
    ok = checks["store"] == "ok" and executor.ready and checks["runner"] == "accepting"
    health = getattr(executor, "health", None)
    groups = [GroupView.model_validate(h, from_attributes=True) for h in health()] if callable(health) else None
    view = ReadyView(status="ready" if ok else "not ready", groups=groups, attention=_attention(executor), **checks)
    return Response(view, status_code=200 if ok else 503)


def _attention(executor) -> list[AttentionRowView] | None:
    """The pipeline's start-up attention probe (an executor with `attention_report()`), else None."""
    report = getattr(executor, "attention_report", None)
    return [AttentionRowView.model_validate(r, from_attributes=True) for r in report()] if callable(report) else None


@get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
async def metrics(svc: Service) -> bytes:
    return await anyio.to_thread.run_sync(svc.metrics.render)


@get("/ceilings", summary="Frame limits per resolution and mode, from the code that judges submissions", responses=problems(401))
async def ceilings(svc: Service) -> CeilingsView:
    p = svc.policy
    return CeilingsView(
        profile=p.profile.name, hardware=p.profile.hardware, attention=p.profile.attention,
        budget_tokens=p.budget.tokens, api_max_frames=p.profile.api_max_frames,
        ceilings=[ceiling_view(r) for r in p.ceilings()],
    )  # fmt: skip


handlers = [healthz, readyz, metrics]
v1_handlers = [ceilings]  # under /v1, behind the token guard
