"""A schemathesis check for what no JSON Schema can say about POST /v1/jobs.

A request the schema accepts can still be refused by admission, with 422: it is over the
capacity profile (the body carries the `ceiling` it is over), or it names an upload that does not
exist. `schemathesis.toml` lets positive_data_acceptance take 422 for that one operation; this
check then requires that every such 422 is one of those two refusals, so a schema that promises
more than the server takes (an extra property, a float, a field combination) still fails the run.
"""

from __future__ import annotations

import schemathesis

_UPLOAD_MISSING = "no upload "


@schemathesis.check
def only_admission_refuses_valid_jobs(ctx, response, case):
    if case.operation.label != "POST /v1/jobs" or response.status_code != 422 or case.meta is None:
        return None
    if not case.meta.generation.mode.is_positive:
        return None
    body = response.json()
    if body.get("ceiling") is not None:
        return True
    errors = body.get("errors") or []
    if errors and all(str(e.get("message", "")).startswith(_UPLOAD_MISSING) for e in errors):
        return True
    raise AssertionError(f"a schema-valid job was refused for a reason the schema should state: {body}")
