"""Schemathesis checks for what no JSON Schema can say about POST /v1/jobs and POST /v1/videos.

A request the schema accepts can still be refused by admission, with 422: it is over the
capacity profile (the body carries the `ceiling` it is over), or its webhook is a target this
deployment does not send to (H3_WEBHOOKS_ALLOW, and where the name resolves: nothing a schema can
state). `schemathesis.toml` lets positive_data_acceptance take 422 for that one operation; this
check then requires that every such 422 is one of those refusals, so a schema that promises more
than the server takes (an extra property, a float, a field combination) still fails the run. An
upload id of the documented form that no upload has is a 404 (documented), never one of these.
"""

from __future__ import annotations

import jsonschema
import schemathesis


def _schema_valid_json(case) -> bool:
    """Whether a JSON body is valid for its operation's document: the stateful phase puts values
    it took from earlier responses into generated bodies, and those need not be."""
    if not str(case.media_type or "").startswith("application/json"):
        return True
    raw = case.operation.schema.raw_schema
    body = raw["paths"][case.operation.path][case.operation.method.lower()]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    return jsonschema.Draft202012Validator({**body, "components": raw.get("components", {})}).is_valid(case.body)


@schemathesis.check
def only_admission_refuses_valid_jobs(ctx, response, case):
    if case.operation.label != "POST /v1/jobs" or response.status_code not in (400, 422) or case.meta is None:
        return None
    if not case.meta.generation.mode.is_positive:
        return None
    if response.status_code == 400:
        raise AssertionError(f"a schema-valid job was refused with 400: {response.text}")
    body = response.json()
    if body.get("ceiling") is not None:
        return True
    errors = body.get("errors") or []
    if errors and all(e.get("field") == "webhook" for e in errors):
        return True  # a target this deployment will not send to: its allow list, and where the name resolves
    raise AssertionError(f"a schema-valid job was refused for a reason the schema should state: {body}")


@schemathesis.check
def only_admission_refuses_valid_videos(ctx, response, case):
    """POST /v1/videos answers admission's refusals (and a file sent inline that is not the image
    its part says) with 400 in OpenAI's shape; any other 400 for schema-valid data means the
    document promises too much (an upload id no upload has is a 404)."""
    if case.operation.label != "POST /v1/videos" or response.status_code != 400 or case.meta is None:
        return None
    if not case.meta.generation.mode.is_positive or not _schema_valid_json(case):
        return None
    error = response.json().get("error") or {}
    if error.get("code") == "refused" and error.get("ceiling") is not None:
        return True
    message = str(error.get("message", ""))
    if error.get("code") == "invalid_upload" and "its leading bytes do not match" in message:
        return True  # a file that is not the image its part says
    raise AssertionError(f"a schema-valid video was refused for a reason the schema should state: {error}")
