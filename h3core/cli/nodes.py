"""Commands for a store shared by runner nodes: `nodes` (who runs, with how many slots, last
beat; draining one, or clearing its drain) and `migrate` (a SQLite store into PostgreSQL, every
log intact)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from h3core.adapters.store.location import is_postgres_url, parse_location
from h3core.adapters.store.nodes import NodeRow, WithNodeLeases
from h3core.cli.app import app
from h3core.cli.common import EXIT_DATA, DbOption, console, fail, open_store
from h3core.runtime.draining import NoSuchNode, set_draining


@app.command()
def nodes(
    db: DbOption = Path("h3core.db"),
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per node instead of a table.")] = False,
    drain: Annotated[
        str | None,
        typer.Option("--drain", metavar="NODE", help="Mark NODE draining first: it takes no new jobs; what it runs goes on."),
    ] = None,
    undrain: Annotated[
        str | None, typer.Option("--undrain", metavar="NODE", help="Clear NODE's drain first: it takes new jobs again.")
    ] = None,
) -> None:
    """The runner nodes of a PostgreSQL store: id, host and pid, slots, attempts leased now,
    what their executor can start, the frames its model's window admits and its largest group's
    token budget (what the node claims by), and their last heartbeat (alive, stale past the lease,
    or left, and draining). With --drain or --undrain, that change first."""
    if not is_postgres_url(db):
        fail(f"{db} is a SQLite store: one runner, no nodes (its runner holds {db}.runner.lock)")
    with open_store(db) as store:
        assert isinstance(store, WithNodeLeases)
        for node, draining in ((drain, True), (undrain, False)):
            if node is not None:
                try:
                    set_draining(store, node, draining)
                except NoSuchNode as exc:
                    fail(str(exc))
        rows = store.leases.nodes()
    if as_json:
        for n in rows:
            typer.echo(json.dumps({**n.model_dump(mode="json"), "alive": n.alive()}))
        return
    table = Table(title=f"runner nodes of {db}", title_justify="left")
    for column in ("node", "host", "pid", "slots", "running", "modes", "frames", "budget", "last beat", "state"):
        table.add_column(column, no_wrap=True, justify="right" if column in ("pid", "slots", "running", "budget") else "left")
    for n in rows:
        state = "left" if n.left_at is not None else ("alive" if n.alive() else f"stale (lease {n.lease_s:g}s)")
        style = {"alive": "green", "left": "dim"}.get(state, "red")
        if n.drain is not None:
            state += f", draining since {n.drain.since:%Y-%m-%d %H:%M:%S}" + (f" by {n.drain.by}" if n.drain.by else "")
            style = "yellow" if style == "green" else style
        table.add_row(
            n.node_id,
            n.host,
            str(n.pid),
            str(n.slots),
            str(n.leases),
            ",".join(n.modes) or "-",
            *_limits(n),
            f"{n.beat_age_s:.1f}s ago",
            Text(state, style=style),
        )
    out = console()
    if not rows:
        out.print(f"no runner node has joined {db}")
        return
    out.print(table)


def _limits(node: NodeRow) -> tuple[str, str]:
    """The frames the node's window admits and its largest group's token budget, as its admission
    judges by them (its profiles' budgets included) ("-": none stated or no bound)."""
    caps = node.rules.capabilities if node.rules is not None else node.capabilities
    if caps is None:
        return "-", "-"
    window = caps.window
    frames = f"{window.min_frames}-{window.max_frames if window.max_frames is not None else ''}" if window is not None else "-"
    budgets = [g.tokens for g in caps.groups if g.tokens is not None]
    return frames, f"{max(budgets):,}" if budgets and len(budgets) == len(caps.groups) else "-"


@app.command()
def migrate(
    db: DbOption = Path("h3core.db"),
    to: Annotated[str, typer.Option("--to", help="The PostgreSQL store to copy into (postgresql://...).")] = "",
    batch: Annotated[int, typer.Option("--batch", min=1, help="Events per transaction.")] = 5000,
) -> None:
    """Copy a SQLite store into PostgreSQL: every event in the order it was stored (so positions
    keep their order), subscriptions' saved positions translated, webhook delivery records, videos
    deleted through /v1/videos; then
    compare every job's log and state on both sides. Stop the SQLite store's runner first. Run
    again after an interruption: what is already there is skipped. Check with `h3core verify --db URL`."""
    target = parse_location(to)
    if not is_postgres_url(target):
        fail("--to must be a postgresql:// URL")
    if is_postgres_url(db):
        fail(f"--db must be the SQLite store to copy from, not {db}")
    with open_store(db) as source, open_store(target, create=True) as dest:
        copied, cursor = 0, 0
        while rows := source.events_after(cursor, batch):
            copied += dest.import_events([e for _, e in rows])
            cursor = rows[-1][0]
        saved = source.positions()
        for name, position in saved.items():
            dest.save_position(name, _translated(source, dest, position))
        job_ids = source.job_ids()
        records = [r for job_id in job_ids for r in source.deliveries(job_id)]
        if records:
            dest.save_deliveries(records)
        # Kept beside the log, not in it: what /v1/videos leaves out (a mark made before is kept).
        deleted = {j: at for j in job_ids if (at := source.video_deleted_at(j)) is not None}
        for job_id, at in deleted.items():
            dest.mark_video_deleted(job_id, at)
        different = [j for j in job_ids if source.events(j) != dest.events(j) or source.get(j) != dest.get(j)]
        if different:
            fail(f"{len(different)} jobs differ after the copy (first: {different[0]}); the target is left as it is", EXIT_DATA)
    console().print(
        f"migrated {db} to {target}: {len(job_ids)} jobs, {copied} events copied (the rest were there), "
        f"{len(saved)} positions, {len(records)} delivery records, {len(deleted)} deleted videos; "
        "every job's log and state match"
    )


def _translated(source, dest, position: int) -> int:
    """The target's position of the source's newest event at or before `position`: the same place
    in the log, as the events keep their order (0: before every event)."""
    at = source.event_at_or_before(position)
    return dest.position_of(*at) if at is not None else 0
