"""The `h3core` command line: serve, submit to, inspect, check, move and run a store's jobs.

    h3core serve               the HTTP service (every setting a flag and an H3_* variable)
    h3core submit / cancel     a job through a running service (--watch follows it)
    h3core replay JOB_ID       a job's timeline, folded from its log, and why it ended so
    h3core verify              fold every log, compare with the jobs projection, check the videos
    h3core gc                  remove the artifact files no job needs
    h3core export / import     the event log as JSON Lines
    h3core jobs                the newest jobs, as a table
    h3core backup DEST         copy the store while it is in use
    h3core nodes               the runner nodes of a PostgreSQL store, their slots and last beats
    h3core migrate --to URL    copy a SQLite store into PostgreSQL, every log intact
    h3core migrate-artifacts DIR --to s3://...   copy a folder of videos into an object store, each checked
    h3core worker              run queued jobs with the configured executor until SIGTERM/SIGINT
    h3core enqueue --prompt    store a job for a worker to run (no runner is started)
    h3core capacity show/fit/probe, h3core model make-tiny/attention

Every command on a store takes `--db PATH` or `--db postgresql://...` (env `H3_DB`, default `h3core.db`). Exit codes: 0 fine;
1 the data is wrong (a log breaks a rule, a line does not parse); 2 the request is wrong (no
such job, no such store, a bad value); 3 another worker already holds the store.
"""

from h3core.cli import artifacts, capacity, client, logs, model, nodes, replay, serve, worker  # noqa: F401  (each registers its commands)
from h3core.cli.app import app, reflow_help

reflow_help(app)

__all__ = ["app", "main"]


def main() -> None:
    """Run the `h3core` command line: the `h3core` script and `python -m h3core.cli` call this."""
    app()
