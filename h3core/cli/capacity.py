"""`h3core capacity`: the ceilings a profile enforces, and a budget proposed from the job log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from h3core.adapters.profiles import ProfileError, builtin_profiles, dump_profile, load_profile, load_profile_ref
from h3core.adapters.store.location import is_postgres_url
from h3core.adapters.store.nodes import WithNodeLeases
from h3core.cli.app import app
from h3core.cli.common import EXIT_DATA, DbOption, console, console_err, fail, first_error, open_store
from h3core.domain.admission import DEFAULT_API_MAX_FRAMES, DEFAULT_RESOLUTIONS, AdmissionRules, RulesStatement
from h3core.domain.capabilities import Capabilities
from h3core.domain.capacity import CapacityProfile, Evidence, Fit, Outcome, evidence_points, fit
from h3core.domain.probe import GIB, probed_profile
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState
from h3core.runtime.admission import CapabilityFile, LocalAdmission, capabilities_path
from h3core.runtime.node import build_executor
from h3core.runtime.settings import Settings, SettingsError

SOURCE_NOTE = "measured by `h3core capacity probe` with random weights (memory and time do not depend on their values)"

capacity_app = typer.Typer(help="Admission by measured capacity: the ceilings enforced, a budget fitted from the log.")
app.add_typer(capacity_app, name="capacity")

ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        envvar="H3_CAPACITY_PROFILE",
        help="A capacity profile: a TOML file, or a built-in one by name. Default: the built-in one that describes the executor.",
    ),
]
ExecutorOption = Annotated[
    str | None,
    typer.Option(
        "--executor", help="Build this executor from the settings (H3_*, --config) instead of reading what the runner states."
    ),
]


def profile_named(ref: str | None) -> CapacityProfile | None:
    """The capacity profile `ref` names (a TOML file, or a built-in profile by name), or None when
    none is given. Exits 2 if it cannot be loaded."""
    if ref is None:
        return None
    try:
        return load_profile_ref(ref)
    except ProfileError as exc:
        fail(str(exc))


# What a runner can run, where that was read, and the rules it states it admits by (PostgreSQL
# nodes: its capabilities under its own profile; None where it states none).
_Stated = tuple[Capabilities, str, RulesStatement | None]


def _stated(db: Path) -> list[_Stated]:
    """What the runners on `db` state they can run: each live node's on PostgreSQL, else the
    SQLite runner's published file (none: nothing stated)."""
    if is_postgres_url(db):
        with open_store(db) as store:
            assert isinstance(store, WithNodeLeases)
            rows = [r for r in store.leases.nodes() if r.alive() and r.capabilities is not None]
        return [(r.capabilities, f"as node {r.node_id} on {db} states it", r.rules) for r in rows if r.capabilities is not None]
    board = CapabilityFile(capabilities_path(db))
    return [(board.read(), f"as the runner on {db} states it", None)] if board.path.exists() else []


def _capabilities(db: Path, executor: str | None) -> list[_Stated]:
    """What the runners on `db` state they can run, or else what the configured executor would."""
    if executor is None and (stated := _stated(db)):
        return stated
    chosen: dict[str, Any] = {"executor": executor} if executor else {}  # a str: Settings validates it
    try:
        settings = Settings(db=db, **chosen)
        built = build_executor(settings)
    except (ValidationError, SettingsError) as exc:
        fail(
            f"cannot build the {executor or 'configured'} executor: "
            f"{first_error(exc) if isinstance(exc, ValidationError) else exc}"
        )
    return [(built.capabilities(), f"the {settings.executor} executor as configured (not running)", None)]


def _point(p) -> str:
    return f"{p.width}x{p.height}x{p.frames}" + (f" +{p.ref_images} refs" if p.ref_images else "")


@capacity_app.command("show")
def show(db: DbOption = Path("h3core.db"), profile: ProfileOption = None, executor: ExecutorOption = None) -> None:
    """Print the ceilings the service enforces: the capacity profile and what the executor can run,
    together (on PostgreSQL, for each live runner node, by the profile it states unless `--profile`
    names one)."""
    for caps, where, rules in _capabilities(db, executor):
        _show(caps, where, profile, rules)


def _show(caps: Capabilities, where: str, profile: str | None, rules: RulesStatement | None = None) -> None:
    if rules is not None and profile is None:
        contract = AdmissionRules.of(rules)  # the node's own: what every node admits for it by
    else:
        contract = LocalAdmission(lambda: caps, builtin_profiles(), profile=profile_named(profile)).current()
    prof, caps = contract.profile, contract.caps
    out = console()
    out.print(Text.assemble(("executor ", "bold"), (caps.executor, "bold"), f"  ({where})"))
    out.print(
        f"hardware:  {caps.hardware or '-'}"
        + (f"; kernel {caps.kernel}" if caps.kernel else "")
        + (f"; model {caps.model}" if caps.model else "")
    )
    out.print(
        "modes:     " + "; ".join(f"{m.mode} " + ("served" if m.served else f"NOT SERVED ({m.reason})") for m in caps.modes)
    )
    if caps.window is not None:
        out.print(f"window:    {caps.window.describe()}")
    if caps.max_tokens is not None:
        out.print(f"kernel:    at most {caps.max_tokens:,} tokens ({caps.max_tokens_reason or 'attention'})")
    if prof is None:
        out.print("profile:   none describes this executor: no memory budget is known (nothing measured here)")
    else:
        b = prof.budget()
        out.print(
            Text.assemble(("profile   ", "bold"), (prof.name, "bold"), f"  ({prof.hardware}; {prof.attention}; {prof.source})")
        )
        above = (
            f"; smallest OOM {_point(b.smallest_oom)} = {b.smallest_oom_tokens:,} tokens"
            if b.smallest_oom
            else "; no OOM measured: UNVERIFIED"
        )
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
    columns: list[tuple[str, JustifyMethod]] = [
        ("resolution", "left"),
        ("mode", "left"),
        ("max frames", "right"),
        ("seconds", "right"),
        ("reason", "left"),
        ("min frames", "right"),
        ("tokens at max", "right"),
        ("verified", "left"),
    ]
    for col, justify in columns:
        table.add_column(col, justify=justify, no_wrap=True)
    for row in contract.ceilings():
        s = row.shape
        mode = s.mode + (f" ({s.keyframes} keyframe{'s' if s.keyframes > 1 else ''})" if s.keyframes else "")
        mode += f" ({s.ref_images} image ref, 16:9)" if s.ref_images else ""
        table.add_row(
            f"{s.width}x{s.height}",
            mode,
            str(row.max_frames),
            f"{row.max_frames / 24:.1f}",
            row.reason,
            str(row.min_frames),
            f"{row.tokens_at_max:,}" if row.tokens_at_max else "-",
            "yes" if row.verified else "NO",
        )
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
    runs: tuple[tuple[str, Outcome], ...] = (("done", "ran"), ("failed", "oom"))
    for status, outcome in runs:
        for state in _finished(store, status):
            if state.tokens is None or (outcome == "oom" and (state.error is None or state.error.kind != "oom")):
                continue
            if state.executor is None or not profile.describes_run(state.executor, state.info):
                other += 1
                continue
            out.append(
                Evidence(
                    job_id=state.job_id, tokens=state.tokens, outcome=outcome, references=state.request.references is not None
                )
            )
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
                out.print(
                    f"  {other} finished job(s) ran where this profile does not describe "
                    "(other hardware, model or kernel): not evidence for it"
                )
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
    out.print(
        Text(f"  runs {label} (the profile's points and the store's jobs): {f.ran} ran, {f.oom} out of memory", style="bold")
    )
    out.print(f"    bound below (largest that ran):      {_describe(store, f.bound_below)}")
    out.print(f"    bound above (smallest out of memory): {_describe(store, f.bound_above)}")
    for o, r in f.contradictions:
        out.print(
            Text(
                f"    CONTRADICTION: {_describe(store, o)} ran out of memory, "
                f"but {_describe(store, r)} ran: not one budget (other hardware, or references?)",
                style="red",
            )
        )
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
                lines.append(
                    f"      {{ width = {r.width}, height = {r.height}, frames = {r.frames}, "
                    f'outcome = "{outcome}", note = "job {e.job_id}" }}'
                )
        if lines:
            out.print("    to adopt it, add these as [[points]] in the profile:")
            for line in lines:
                out.print(line)


def _resolution(text: str) -> tuple[int, int]:
    try:
        width, height = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give a canvas as WIDTHxHEIGHT, e.g. 1344x768") from None
    return width, height


@capacity_app.command("probe")
def probe_cmd(
    geometry: Annotated[
        str, typer.Option(help="The model to build: released (diffusers' default configs) or tiny (h3core's tiny configs).")
    ] = "released",
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir", help="Take the configs and the model's name from this folder instead (its weights are not read)."
        ),
    ] = None,
    device: Annotated[str, typer.Option(envvar="H3_DEVICE", help="Torch device, as the server's.")] = "cpu",
    dtype: Annotated[
        str, typer.Option(envvar="H3_DTYPE", help="Weights' dtype, as the server's (bfloat16 on a GPU).")
    ] = "float32",
    attention: Annotated[
        str, typer.Option(envvar="H3_ATTENTION", help="The attention kernel, chosen as the server chooses it.")
    ] = "auto",
    math_max_tokens: Annotated[
        int, typer.Option(envvar="H3_ATTENTION_MATH_MAX_TOKENS", help="Longest sequence allowed on SDPA's MATH kernel.")
    ] = 4096,
    resolution: Annotated[
        list[str] | None,
        typer.Option("--resolution", help="A canvas to search (WIDTHxHEIGHT; repeat for more). Default 1344x768."),
    ] = None,
    start_frames: Annotated[int, typer.Option(min=1, help="The first frame count measured.")] = 124,
    max_frames: Annotated[
        int,
        typer.Option(min=1, help="The longest measured (the API's cap by default; more finds an out-of-memory bound past it)."),
    ] = 1200,
    growth: Annotated[float, typer.Option(min=1.01, help="Factor by which frames grow until a point runs out of memory.")] = 2.0,
    precision: Annotated[int, typer.Option(min=1, help="Stop bisecting once the boundary is this many frames wide.")] = 17,
    text_tokens: Annotated[
        int, typer.Option(min=1, help="Prompt rows in the sequence (the API's longest prompt makes about 2,000).")
    ] = 2048,
    memory_cap: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            help="GiB this probe may hold, weights included (CUDA: the allocator's limit; CPU: the address space, RLIMIT_AS).",
        ),
    ] = None,
    reserve: Annotated[
        float, typer.Option(min=0.0, help="GiB held on the device for parts not built (a text encoder sharing the device).")
    ] = 0.0,
    threads: Annotated[int | None, typer.Option(min=1, help="Torch threads on a CPU.")] = None,
    name: Annotated[str | None, typer.Option(help="The profile's name (default: from the device, kernel and model).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the profile here (default: print it).")] = None,
) -> None:
    """Measure this machine's token budget with random weights and write a capacity profile.

    Builds the transformer and the VAEs at the chosen geometry with random weights on the device
    (nothing is downloaded or written), runs one denoising step and the decode of a job for
    growing frame counts at each canvas until one runs out of memory (or --max-frames runs), then
    bisects. Prints each point (step and decode seconds, peak memory) and a profile marked
    "probed with random weights" whose budget is what the points imply. One device only: budgets
    of groups of several devices (H3_GROUP_SIZE > 1) are not probed yet.
    """
    from h3core.executors.pipeline.probe import GEOMETRIES, ProbeError, ProbeSpec, probe_process, search

    if geometry not in GEOMETRIES:
        fail(f"--geometry must be one of {', '.join(GEOMETRIES)}, not {geometry!r}")
    canvases = [_resolution(r) for r in resolution or ["1344x768"]]
    for width, height in canvases:
        try:
            GenerationRequest(prompt="-", width=width, height=height, frames=max_frames)
        except ValidationError as exc:
            fail(f"--resolution {width}x{height} / --max-frames {max_frames}: {first_error(exc)}")
    spec = ProbeSpec(
        geometry=geometry,
        model_dir=str(model_dir) if model_dir else None,
        device=device,
        dtype=dtype,
        attention=attention,
        math_max_tokens=math_max_tokens,
        text_tokens=text_tokens,
        memory_cap_gib=memory_cap,
        reserve_gib=reserve,
        threads=threads,
    )
    err = console_err()
    err.print(f"building the {model_dir or geometry} geometry with random weights on {device} ({dtype})…")
    try:
        with probe_process(spec) as worker:
            ident = worker.identity
            resident = f"{worker.resident_bytes / GIB:.2f} GiB resident" if worker.resident_bytes else "built"
            err.print(
                f"{ident.device}: {ident.model}, {resident} after {worker.build_seconds:.1f} s; attention {ident.attention}"
            )

            def show_point(m) -> None:
                style = "green" if m.outcome == "ran" else "red"
                err.print(Text.assemble(f"  {m.width}x{m.height}x{m.frames:<5} ", (f"{m.outcome:<4}", style), f" {m.describe()}"))

            points = search(
                worker.measure,
                canvases,
                max_frames=max_frames,
                start=start_frames,
                growth=growth,
                precision=precision,
                on_point=show_point,
            )
    except ProbeError as exc:
        fail(str(exc), EXIT_DATA)
    try:
        profile = probed_profile(
            ident, points, api_max_frames=DEFAULT_API_MAX_FRAMES, resolutions=[*canvases, *DEFAULT_RESOLUTIONS], name=name
        )
    except ValueError as exc:
        why = "; ".join(e["msg"] for e in exc.errors()) if isinstance(exc, ValidationError) else str(exc)
        fail(f"the points give no profile: {why}", EXIT_DATA)
    budget = profile.budget()
    bound = (
        f", below {budget.smallest_oom_tokens:,} that ran out of memory"
        if budget.verified
        else "; UNVERIFIED: nothing ran out of memory"
    )
    err.print(Text(f"budget: {budget.tokens:,} tokens (largest that ran {_point(budget.largest_ran)}{bound})", style="bold"))
    header = (
        f"Capacity profile {profile.name}: {SOURCE_NOTE}\n"
        f"geometry {ident.geometry} ({ident.model}), {ident.device} {ident.dtype}, attention {ident.attention};\n"
        f"{ident.text_tokens} prompt rows; one denoising step and the decode per point "
        "(step and decode seconds, peak memory in the notes).\n"
        + (
            "UNVERIFIED: no point ran out of memory, so the budget is only the largest run that fit.\n"
            if not budget.verified
            else ""
        )
        + "Budgets of groups of several devices are not probed."
    )
    text = dump_profile(profile, header=header)
    if output is None:
        console().out(text, end="")
        return
    output.write_text(text)
    try:
        load_profile(output)
    except ProfileError as exc:  # what was written must be what the service loads
        fail(f"{output} does not load back: {exc}", EXIT_DATA)
    err.print(f"wrote {output} (use it with --capacity-profile {output})")
