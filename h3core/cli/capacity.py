"""`h3core capacity`: the ceilings a profile enforces, and a budget proposed from the job log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.profiles import ProfileError, builtin_profiles, load_profile_ref
from h3core.cli.app import app
from h3core.cli.common import DbOption, console, fail, first_error, open_store
from h3core.contracts import CapabilityFile, LiveContract, capabilities_path
from h3core.domain.capabilities import Capabilities
from h3core.domain.capacity import CapacityProfile, Evidence, Fit, evidence_points, fit
from h3core.domain.state import JobState

capacity_app = typer.Typer(help="Admission by measured capacity: the ceilings enforced, a budget fitted from the log.")
app.add_typer(capacity_app, name="capacity")

ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile", envvar="H3_CAPACITY_PROFILE",
        help="A capacity profile: a TOML file, or a built-in one by name. Default: the built-in one that describes the executor.",
    ),
]  # fmt: skip
ExecutorOption = Annotated[
    str | None,
    typer.Option("--executor", help="Build this executor from the settings (H3_*, --config) instead of reading what the runner states."),
]


def profile_named(ref: str | None) -> CapacityProfile | None:
    if ref is None:
        return None
    try:
        return load_profile_ref(ref)
    except ProfileError as exc:
        fail(str(exc))


def admission(db: Path, profile: str | None) -> LiveContract:
    """The contract a runner on `db` admits by: what it published it can run, with the profile."""
    return LiveContract(CapabilityFile(capabilities_path(db)).read, builtin_profiles(), profile=profile_named(profile))


def _capabilities(db: Path, executor: str | None) -> tuple[Capabilities, str]:
    """What the runner on `db` states it can run, or else what the configured executor would."""
    board = CapabilityFile(capabilities_path(db))
    if executor is None and board.path.exists():
        return board.read(), f"as the runner on {db} states it"
    from h3core.adapters.uploads import LocalUploadStore
    from h3core.service.executors import make_executor
    from h3core.service.settings import Settings, SettingsError

    try:
        settings = Settings(db=db, **({"executor": executor} if executor else {}))
        built = make_executor(settings, LocalArtifactStore(settings.artifacts), LocalUploadStore(settings.uploads))
    except (ValidationError, SettingsError) as exc:
        fail(f"cannot build the {executor or 'configured'} executor: {first_error(exc) if isinstance(exc, ValidationError) else exc}")
    return built.capabilities(), f"the {settings.executor} executor as configured (not running)"


def _point(p) -> str:
    return f"{p.width}x{p.height}x{p.frames}" + (f" +{p.ref_images} refs" if p.ref_images else "")


@capacity_app.command("show")
def show(db: DbOption = Path("h3core.db"), profile: ProfileOption = None, executor: ExecutorOption = None) -> None:
    """Print the ceilings the service enforces: the capacity profile and what the executor can run, together."""
    caps, where = _capabilities(db, executor)
    contract = LiveContract(lambda: caps, builtin_profiles(), profile=profile_named(profile)).current()
    prof, caps = contract.profile, contract.caps
    out = console()
    out.print(Text.assemble(("executor ", "bold"), (caps.executor, "bold"), f"  ({where})"))
    out.print(f"hardware:  {caps.hardware or '-'}" + (f"; kernel {caps.kernel}" if caps.kernel else "") + (f"; model {caps.model}" if caps.model else ""))
    out.print("modes:     " + "; ".join(f"{m.mode} " + ("served" if m.served else f"NOT SERVED ({m.reason})") for m in caps.modes))
    if caps.window is not None:
        out.print(f"window:    {caps.window.describe()}")
    if caps.max_tokens is not None:
        out.print(f"kernel:    at most {caps.max_tokens:,} tokens ({caps.max_tokens_reason or 'attention'})")
    if prof is None:
        out.print("profile:   none describes this executor: no memory budget is known (nothing measured here)")
    else:
        b = prof.budget()
        out.print(Text.assemble(("profile   ", "bold"), (prof.name, "bold"), f"  ({prof.hardware}; {prof.attention}; {prof.source})"))
        above = f"; smallest OOM {_point(b.smallest_oom)} = {b.smallest_oom_tokens:,} tokens" if b.smallest_oom else "; no OOM measured: UNVERIFIED"
        out.print(
            f"budget:    {b.tokens:,} video+audio tokens = largest run that fit {_point(b.largest_ran)} "
            f"({b.largest_ran_tokens:,}){above}; safety margin {b.safety_margin:g} of the gap"
        )
        refs = prof.references
        handling = f"budget {refs.budget_tokens:,} tokens" if refs.policy == "budget" else "rejected"
        out.print(f"references: {handling} ({refs.note or 'unverified: no measured budget'})")
    for g in caps.groups:
        out.print(f"group of {g.size}: " + (f"{g.tokens:,} tokens ({g.source})" if g.tokens is not None else "no budget"))
    out.print(f"API cap:   {contract.api_max_frames} frames")
    table = Table(title="admitted frame counts", title_justify="left")
    for col, justify in [("resolution", "left"), ("mode", "left"), ("max frames", "right"), ("seconds", "right"),
                         ("reason", "left"), ("min frames", "right"), ("tokens at max", "right"), ("verified", "left")]:  # fmt: skip
        table.add_column(col, justify=justify, no_wrap=True)
    for row in contract.ceilings():
        s = row.shape
        mode = s.mode + (f" ({s.keyframes} keyframe{'s' if s.keyframes > 1 else ''})" if s.keyframes else "")
        mode += f" ({s.ref_images} image ref, 16:9)" if s.ref_images else ""
        table.add_row(
            f"{s.width}x{s.height}", mode, str(row.max_frames), f"{row.max_frames / 24:.1f}", row.reason, str(row.min_frames),
            f"{row.tokens_at_max:,}" if row.tokens_at_max else "-", "yes" if row.verified else "NO",
        )  # fmt: skip
    out.print(table)


def _finished(store, status: str) -> Iterator[JobState]:
    before = None
    while True:
        page = store.list_jobs(status=status, limit=1000, before=before)
        if not page:
            return
        for _, state in page:
            yield state
        before = page[-1][0]


def evidence_from_store(store, profile: CapacityProfile) -> tuple[list[Evidence], int]:
    """Done jobs and jobs that failed with an OOM that ran where `profile` describes (their
    Running event says where), each with its token count; and how many others were left out."""
    out, other = [], 0
    for status, outcome in (("done", "ran"), ("failed", "oom")):
        for state in _finished(store, status):
            if state.tokens is None or (outcome == "oom" and (state.error is None or state.error.kind != "oom")):
                continue
            if state.executor is None or not profile.describes_run(state.executor, state.info):
                other += 1
                continue
            out.append(Evidence(job_id=state.job_id, tokens=state.tokens, outcome=outcome, references=state.request.references is not None))  # type: ignore[arg-type]
    return out, other


def _describe(store, e: Evidence | None) -> str:
    if e is None:
        return "none"
    if e.job_id.startswith("profile:"):
        return f"measured {e.job_id.removeprefix('profile:')}: {e.tokens:,} tokens"
    r = store.get(e.job_id).request
    return f"job {e.job_id} ({r.mode} {r.width}x{r.height}x{r.frames}): {e.tokens:,} tokens"


@capacity_app.command("fit")
def fit_cmd(db: DbOption = Path("h3core.db"), profile: ProfileOption = None) -> None:
    """Propose a token budget per profile from what jobs did (done vs out of memory), with the evidence.

    A job counts only for a profile that describes where it ran (hardware, model, kernel, as its
    Running event recorded), and the profile's own measured points count too, so no proposal
    falls below a measured run unless an out-of-memory run bounds it. Nothing changes by itself:
    add the bounding jobs to the profile's points if you agree.
    """
    explicit = profile_named(profile)
    profiles = [explicit] if explicit is not None else builtin_profiles()
    out = console()
    with open_store(db) as store:
        for prof in profiles:
            jobs, other = evidence_from_store(store, prof)
            out.print(Text(f"profile {prof.name} ({prof.hardware})", style="bold"))
            if other:
                out.print(f"  {other} finished job(s) ran where this profile does not describe (other hardware, model or kernel): not evidence for it")
            if not jobs:
                out.print("  no job in the store ran where this profile describes: nothing to fit")
                continue
            measured = evidence_points(prof.points + prof.references.points)
            current = prof.budget().tokens
            with_jobs = {e.references for e in jobs}
            for f in fit([*measured, *jobs], safety_margin=prof.safety_margin):
                if f.references in with_jobs:
                    _print_fit(out, store, f, prof.references.budget_tokens if f.references else current)


def _print_fit(out, store, f: Fit, now: int | None) -> None:
    label = "with references" if f.references else "without references"
    out.print(Text(f"  runs {label} (the profile's points and the store's jobs): {f.ran} ran, {f.oom} out of memory", style="bold"))
    out.print(f"    bound below (largest that ran):      {_describe(store, f.bound_below)}")
    out.print(f"    bound above (smallest out of memory): {_describe(store, f.bound_above)}")
    for o, r in f.contradictions:
        out.print(Text(f"    CONTRADICTION: {_describe(store, o)} ran out of memory, "
                       f"but {_describe(store, r)} ran: not one budget (other hardware, or references?)", style="red"))  # fmt: skip
    if f.proposed_budget is None:
        out.print("    nothing ran: no budget can be proposed")
        return
    change = "" if now is None else f" (profile now: {now:,}; {f.proposed_budget - now:+,})"
    out.print(Text(f"    proposed budget: {f.proposed_budget:,} tokens{change}", style="green"))
    if not f.references:
        lines = []
        for e, outcome in ((f.bound_below, "ran"), (f.bound_above, "oom")):
            if e is not None and not e.job_id.startswith("profile:"):
                r = store.get(e.job_id).request
                lines.append(f'      {{ width = {r.width}, height = {r.height}, frames = {r.frames}, outcome = "{outcome}", note = "job {e.job_id}" }}')
        if lines:
            out.print("    to adopt it, add these as [[points]] in the profile:")
            for line in lines:
                out.print(line)
