"""Schemathesis against the live service's own OpenAPI document (/schema/openapi.json).

Bounded so it runs in CI: 25 derandomized examples per operation and generation mode. Two checks,
each its own test so that a known deviation in one cannot hide a failure of the other:
`not_a_server_error` (no 5xx, ever) and `response_schema_conformance` (every documented response
body matches its schema).

schemathesis' lazy pytest loader (`schemathesis.pytest.from_fixture`) fails under pytest 9
(`'Function' object has no attribute '_nodeid'`), and `schema.parametrize()` needs the schema at
import time, before any server runs. So each operation's cases come from its public strategy,
`APIOperation.as_strategy(generation_mode)`, under an explicit Hypothesis `@given`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance
from schemathesis.core.failures import FailureGroup

from tests.integration.service.conftest import Servers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Every operation in the schema, and whether it has inputs that negative cases can break
# (a body, or a query or header parameter; a bare string path parameter cannot be invalid).
OPERATIONS = {
    "GET /v1/jobs": True,
    "POST /v1/jobs": True,
    "GET /v1/jobs/{job_id}": False,
    "POST /v1/jobs/{job_id}/cancel": False,
    "GET /v1/jobs/{job_id}/events": False,
    "GET /v1/jobs/{job_id}/stream": True,  # random ids only: every case is a 404 or a 422, never a live stream
    "GET /v1/jobs/{job_id}/video": False,
    "POST /v1/uploads": True,
    "GET /v1/ceilings": False,
    "POST /v1/videos": True,
    "GET /v1/videos": True,
    "GET /v1/videos/{video_id}": False,
    "DELETE /v1/videos/{video_id}": False,
    "GET /v1/videos/{video_id}/content": True,
    "POST /v1/videos/{video_id}/remix": True,
    "GET /healthz": False,
    "GET /readyz": False,
    "GET /metrics": False,
}
CHECKS = {"not_a_server_error": not_a_server_error, "response_schema_conformance": response_schema_conformance}
KNOWN: dict[tuple[str, str, str], str] = {}  # (operation, mode, check) -> why it is expected to fail
EXAMPLES = 25


def cases() -> Iterator:
    for label, negatable in OPERATIONS.items():
        for mode in ("positive", "negative") if negatable else ("positive",):
            for check in CHECKS:
                reason = KNOWN.get((label, mode, check))
                marks = [pytest.mark.xfail(strict=True, raises=FailureGroup, reason=reason)] if reason else []
                yield pytest.param(label, mode, check, id=f"{label}-{mode}-{check}", marks=marks)


@pytest.fixture(scope="module")
def live_schema(tmp_path_factory):
    # Steps so slow that no generated job finishes (nor renders a video) while the fuzzing runs.
    servers = Servers(tmp_path_factory.mktemp("schemathesis"))
    server = servers.start({"H3_FAKE_STEP_SECONDS": "30"})
    try:
        yield schemathesis.openapi.from_url(f"{server.url}/schema/openapi.json")
        assert server.running, server.log()
        server.stop(timeout=15)
    finally:
        servers.kill_all()


def test_every_operation_is_fuzzed(live_schema):
    found = {}
    for result in live_schema.get_all_operations():
        op = result.ok()
        found[f"{op.method.upper()} {op.path}"] = bool(op.body) or any(p.location != "path" for p in op.iter_parameters())
    assert found == OPERATIONS


@pytest.mark.parametrize(("label", "mode", "check"), list(cases()))
def test_api_conforms(live_schema, label, mode, check):
    method, path = label.split(" ", 1)
    operation = live_schema[path][method]
    strategy = operation.as_strategy(generation_mode=GenerationMode(mode))

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(case=strategy)
    def run(case):
        case.call_and_validate(checks=[CHECKS[check]], timeout=15)

    run()
