"""`h3core migrate-artifacts`: a folder artifact store copied into an object store, every copy
read back and its sha256 compared (h3core.runtime.artifact_migration)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from h3core.adapters.artifacts.local import LocalArtifactStore
from h3core.adapters.artifacts.location import is_s3_url
from h3core.cli.app import app
from h3core.cli.common import EXIT_DATA, console, fail, open_artifacts_at


@app.command("migrate-artifacts")
def migrate_artifacts(
    source: Annotated[Path, typer.Argument(help="The artifacts folder to copy from.")],
    to: Annotated[str, typer.Option("--to", help="The object store to copy into (s3://bucket/prefix).")] = "",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be copied; copy nothing.")] = False,
) -> None:
    """Copy every committed video (with its record), checkpoint, segment and deletion mark of a
    folder into an object store, reading each copy back to compare its sha256; videos no longer as
    recorded are named and not copied (exit 1). Run again after an interruption: what is there is
    skipped. Then set H3_ARTIFACTS to the URL and check with `h3core verify --artifacts URL`."""
    from h3core.adapters.artifacts.s3 import S3ArtifactStore
    from h3core.runtime.artifact_migration import migrate

    if not is_s3_url(to):
        fail("--to must be an s3://bucket/prefix URL")
    if not source.is_dir():
        fail(f"no artifacts folder at {source}")
    target = open_artifacts_at(to)
    assert isinstance(target, S3ArtifactStore)
    if not target.present():
        fail(f"no bucket {target.bucket!r} at the endpoint (AWS_ENDPOINT_URL), or these credentials may not read it")
    done = migrate(LocalArtifactStore(source, create=False), target, dry_run=dry_run)
    out = console()
    for path, word in done.copied:
        out.print(f"{'would copy' if dry_run else 'copied'} {path}: {word}")
    for path, word in done.failed:
        out.print(Text.assemble(("FAILED ", "bold red"), path, f": {word}"))
    out.print(
        f"{len(done.copied)} {'to copy' if dry_run else 'copied'}, {len(done.skipped)} already there, "
        f"{len(done.failed)} failed: {source} -> {to}"
    )
    if done.failed:
        fail(f"{len(done.failed)} file(s) not copied as recorded", EXIT_DATA)
