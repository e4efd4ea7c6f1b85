"""`h3core capacity`: the ceilings a profile enforces, and a budget proposed from the job log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from h3core.adapters.profiles import ProfileError, load_profile
from h3core.cli.app import app
from h3core.cli.common import DbOption, console, fail, open_store
from h3core.domain.capacity import CapacityPolicy, CapacityProfile, Evidence, Fit, fit
from h3core.domain.state import JobState

capacity_app = typer.Typer(help="Admission by measured capacity: show the ceilings, fit a budget from the log.")
app.add_typer(capacity_app, name="capacity")

ProfileOption = Annotated[
    Path | None,
    typer.Option("--profile", envvar="H3_CAPACITY_PROFILE", help="A capacity profile (TOML); default: the built-in one."),
]


def _profile(path: Path | None) -> CapacityProfile:
    try:
        return load_profile(path)
    except ProfileError as exc:
        fail(str(exc))


def admission(path: Path | None) -> CapacityPolicy:
    """The admission policy for the profile at `path` (the built-in one by default)."""
    return CapacityPolicy(_profile(path))


def _point(p) -> str:
    return f"{p.width}x{p.height}x{p.frames}" + (f" +{p.ref_images} refs" if p.ref_images else "")


@capacity_app.command("show")
def show(profile: ProfileOption = None) -> None:
    """Print the ceilings table the service enforces for a profile, with the budget's evidence."""
    prof = _profile(profile)
    policy = CapacityPolicy(prof)
    b = policy.budget
    out = console()
    out.print(Text.assemble(("profile ", "bold"), (prof.name, "bold"), f"  ({profile or 'built-in'})"))
    out.print(f"hardware:  {prof.hardware}")
    out.print(f"attention: {prof.attention}")
    above = (
        f"; smallest OOM {_point(b.smallest_oom)} = {b.smallest_oom_tokens:,} tokens" if b.smallest_oom else "; no OOM measured"
    )
    out.print(
        f"budget:    {b.tokens:,} video+audio tokens = largest run that fit {_point(b.largest_ran)} "
        f"({b.largest_ran_tokens:,}){above}; safety margin {b.safety_margin:g} of the gap"
    )
    refs = prof.references
    handling = f"budget {refs.budget_tokens:,} tokens" if refs.policy == "budget" else "rejected"
    out.print(f"references: {handling} ({refs.note or 'unverified: no measured budget'})")
    out.print(f"API cap:   {prof.api_max_frames} frames")
    table = Table(title="largest admitted frame count", title_justify="left")
    for col, justify in [("resolution", "left"), ("mode", "left"), ("max frames", "right"), ("seconds", "right"),
                         ("reason", "left"), ("tokens at max", "right"), ("verified", "left")]:  # fmt: skip
        table.add_column(col, justify=justify, no_wrap=True)
    for row in policy.ceilings():
        s = row.shape
        mode = s.mode + (f" ({s.keyframes} keyframe{'s' if s.keyframes > 1 else ''})" if s.keyframes else "")
        mode += f" ({s.ref_images} image ref, 16:9)" if s.ref_images else ""
        table.add_row(
            f"{s.width}x{s.height}", mode, str(row.max_frames), f"{row.max_frames / 24:.1f}", row.reason,
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


def evidence_from_store(store) -> list[Evidence]:
    """Done jobs and jobs that failed with an OOM, each with the token count of its request."""
    out = []
    for state in _finished(store, "done"):
        if state.tokens is not None:
            out.append(Evidence(job_id=state.job_id, tokens=state.tokens, outcome="ran", references=state.request.references is not None))
    for state in _finished(store, "failed"):
        if state.tokens is not None and state.error is not None and state.error.kind == "oom":
            out.append(Evidence(job_id=state.job_id, tokens=state.tokens, outcome="oom", references=state.request.references is not None))
    return out


def _describe(store, e: Evidence | None) -> str:
    if e is None:
        return "none"
    r = store.get(e.job_id).request
    return f"job {e.job_id} ({r.mode} {r.width}x{r.height}x{r.frames}): {e.tokens:,} tokens"


@capacity_app.command("fit")
def fit_cmd(db: DbOption = Path("h3core.db"), profile: ProfileOption = None) -> None:
    """Propose a token budget from what jobs did (done vs out of memory), with the evidence.

    Nothing changes by itself: add the bounding jobs to the profile's points if you agree.
    """
    prof = _profile(profile)
    current = CapacityPolicy(prof).budget.tokens
    with open_store(db) as store:
        fits: list[Fit] = fit(evidence_from_store(store), safety_margin=prof.safety_margin)
        out = console()
        if not fits:
            out.print(f"no evidence in {db}: no done job and no OOM carries a token count")
            return
        for f in fits:
            label = "with references" if f.references else "without references"
            now = prof.references.budget_tokens if f.references else current
            out.print(Text(f"jobs {label}: {f.ran} done, {f.oom} out of memory", style="bold"))
            out.print(f"  bound below (largest that ran):      {_describe(store, f.bound_below)}")
            out.print(f"  bound above (smallest out of memory): {_describe(store, f.bound_above)}")
            for o, r in f.contradictions:
                out.print(Text(f"  CONTRADICTION: {_describe(store, o)} ran out of memory, "
                               f"but {_describe(store, r)} ran: not one budget (other hardware, or references?)", style="red"))  # fmt: skip
            if f.proposed_budget is None:
                out.print("  no job ran: no budget can be proposed")
                continue
            change = "" if now is None else f" (profile now: {now:,}; {f.proposed_budget - now:+,})"
            out.print(Text(f"  proposed budget: {f.proposed_budget:,} tokens{change}", style="green"))
            if not f.references:
                out.print("  to adopt it, add these as [[points]] in the profile:")
                for e, outcome in ((f.bound_below, "ran"), (f.bound_above, "oom")):
                    if e is not None:
                        r = store.get(e.job_id).request
                        out.print(f'    {{ width = {r.width}, height = {r.height}, frames = {r.frames}, outcome = "{outcome}", note = "job {e.job_id}" }}')
