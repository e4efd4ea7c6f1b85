"""Every bench at toy size, so none rots: each runs its `main` as a reader would run it (the same
arguments, smaller), and its printed tables are checked for the machine and the rows it compares.
Figures are never checked (no timing assertion): a row's presence and its verdicts (OK, 0 lost) are."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run_main(module: str, argv: list[str], capsys: pytest.CaptureFixture[str], **kw: object) -> str:
    """`module`'s main(argv), its stdout; the machine table and the command it names checked."""
    importlib.import_module(module).main(argv, **kw)
    out = capsys.readouterr().out
    assert re.search(r"^\| CPU +\| .+ logical cores", out, re.M), out[:2000]
    assert f"command: `{shlex.join(['python', '-m', module, *argv])}`" in out
    return out


def row(out: str, *cells: str) -> str:
    """The first table row whose cells start with `cells` (markdown, padded by rich); fails if none."""
    pattern = r"^\|" + r"\|".join(f" *{re.escape(c)} *" for c in cells) + r"\|.*$"
    found = re.search(pattern, out, re.M)
    assert found, f"no row starting {cells} in:\n{out[-4000:]}"
    return found.group(0)


# The GPU check's steps do their work on import (bench/gpu_check.sh runs each as a module): only
# their imports are checked here; tests/unit/test_gpu_check.py runs the CPU side of the check.
RUN_ON_IMPORT = {"bench.gpu.env", "bench.gpu.jobs", "bench.gpu.placement", "bench.gpu.probe", "bench.gpu.stages"}


def test_every_bench_module_imports_what_it_names_and_none_patches_sys_path():
    for path in sorted((ROOT / "bench").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        text = path.read_text()
        assert not re.search(r"sys\.path\.(insert|append)", text), f"{name} patches sys.path: import bench.common instead"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bench":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                        f"{name}: {node.module} has no {alias.name}"
                    )
        if name not in RUN_ON_IMPORT:
            importlib.import_module(name)


def test_store(tmp_path, capsys):
    out = run_main(
        "bench.throughput.store",
        ["--workdir", str(tmp_path), "--jobs", "4", "--progress", "2", "--floor-ops", "10", "--backlogs", "20", "--reps", "2"]
        + ["--events", "600", "--steps", "4", "--batch", "100", "--sample", "3"],
        capsys,
    )
    for floor in ("fsync 200 B", "sqlite tx, WAL, synchronous=FULL", "sqlite tx, WAL, synchronous=NORMAL"):
        row(out, floor)
    for store in ("memory (no disk)", "sqlite durable=False (NORMAL)", "sqlite durable=True (FULL)"):
        assert row(out, store, "20", "24").count("|") == 11  # 4 jobs x 5 appends, 6 events each; every column
    row(out, "sqlite durable=True", "2 appends x 1 event", "4")
    for read in ("queued(2)", "queued(33)", "counts()", "unfinished()"):
        row(out, "20", read)
    row(out, "replay = read + parse + fold, per job", "600")
    assert re.search(r"check: .*-> +OK", out)


def test_runner(tmp_path, capsys):
    out = run_main(
        "bench.throughput.runner", ["--workdir", str(tmp_path), "--jobs", "6", "--steps", "2", "--slots", "1,4"], capsys
    )
    for durable in ("False", "True"):
        for slots in ("1", "4"):
            assert row(out, durable, slots).rstrip(" |").endswith("OK")


def test_queue_position(pg_server, capsys):
    out = run_main("bench.throughput.queue_position", ["--backlogs", "30", "--reps", "2"], capsys, pg=pg_server)
    for store in ("sqlite", "postgres"):
        row(out, store, "30", "head (1)", "one range, OR (before)")
        row(out, store, "30", "newest (30)", "two ranges (the store's)")


def test_pg_driver(pg_server, capsys):
    out = run_main("bench.studies.pg_driver", ["--appends", "20", "--warmup", "5"], capsys, pg=pg_server)
    row(out, "psycopg 3 (sync)")
    row(out, "asyncpg")  # measured, or "not installed": it is not a dependency


def test_s3_client(seaweed, tmp_path, capsys):
    argv = ["--sizes", "1", "--rounds", "1", "--workdir", str(tmp_path)]
    out = run_main("bench.studies.s3_client", argv, capsys, server=seaweed)
    for op in ("upload", "download", "stream"):
        row(out, "boto3", "1", op)
        row(out, "obstore", "1", op)  # measured, or "not installed": it is not a dependency
    assert "yes: listed True, aborted True" in row(out, "list and abort orphaned multipart uploads")
    assert "put: PreconditionFailed; multipart: PreconditionFailed" in row(out, "create-only put (If-None-Match: *)")


def test_throughput_artifacts(seaweed, tmp_path, capsys):
    argv = ["--sizes", "1", "--rounds", "1", "--warm", "1", "--views", "4", "--pollers", "1", "--workdir", str(tmp_path)]
    out = run_main("bench.throughput.artifacts", argv, capsys, server=seaweed)
    for store in ("local folder", "S3"):
        row(out, "commit", store, "1")
    for serving in ("local folder", "S3 proxy", "S3 redirect"):
        for request in ("GET, first", "GET, warm", "GET 1 MiB range"):
            row(out, request, serving, "1")  # each whole body was compared with its commit's sha256
        for request in ("job view", "job list", "healthz beside views"):
            row(out, request, serving, "-")
    row(out, "S3 proxy")  # the memory table


def test_pg_faults(pg_server, capsys):
    # One idle connection (psycopg_pool's own check pauses a second per dead one after the first) and
    # no frozen writer (each costs the 2 s bound): the integration tests measure that one.
    out = run_main("bench.studies.pg_faults", ["--reads", "20", "--pool", "1", "--stalls", "0"], capsys, pg=pg_server)
    row(out, "no check", "1")  # the dead idle connection failed a read
    row(out, "h3core's (Connections)", "0")


def test_commit(tmp_path, capsys):
    out = run_main("bench.studies.commit", ["--commits", "5", "--rounds", "2", "--workdir", str(tmp_path)], capsys)
    row(out, "crash-safe (this checkout)")
    row(out, "first round (3ac7012)")


def test_http_load(tmp_path, capsys):
    out = run_main(
        "bench.throughput.http_load",
        ["--workdir", str(tmp_path), "--jobs", "60", "--seconds", "0.6", "--warmup", "0.2", "--pollers", "2"]
        + ["--submitters", "1", "--slots", "2", "--poll-every", "0.02", "--passes", "mixed", "--drain", "0.2"]
        + ["--breakdown", "5", "--profile", "pollers only", "--top", "3"],
        capsys,
    )
    # Polls and submits answered, none refused or dropped (the last column: errors).
    assert row(out, "mixed", "2", "1").rstrip(" |").endswith(" 0")
    assert out.count(row(out, "mixed", "2", "1")) == 1
    row(out, "status p99 < 20 ms at 64 pollers", "mixed")
    row(out, ">= 300 jobs/s end to end", "mixed")
    row(out, "GET /v1/jobs/{id}", "store.get(id): SQL + parse, called directly", "5")
    row(out, "POST /v1/jobs", "admission: LocalAdmission.decide(request)", "5")
    assert "### Server profile (cProfile, CPU time of every thread)" in out  # the profiled server ran and wrote it


def test_readyz(tmp_path, capsys):
    out = run_main(
        "bench.throughput.readyz",
        ["--workdir", str(tmp_path), "--jobs", "60", "--seconds", "0.6", "--warmup", "0.2", "--writers", "1"]
        + ["--pollers", "2", "--submitters", "1", "--readers", "1", "--slots", "2", "--against", "HEAD"]
        + ["--against-path", str(ROOT)],
        capsys,
    )
    row(out, "HEAD")  # the other side's pass: this checkout again (no archive of another commit)


def test_console(tmp_path, capsys):
    out = run_main(
        "bench.throughput.console",
        ["--workdir", str(tmp_path), "--jobs", "150", "--reps", "2", "--running", "2", "--step", "0.1", "--seconds", "1.5"],
        capsys,
    )
    for view in ("first page (running, queued, ended)", "status=done", "text 'rain' (read and matched here)"):
        row(out, view)
    row(out, "live fragment (what an update fetches)")
    row(out, "2")  # the page following the 2 running jobs: its updates


def test_webhooks(tmp_path, capsys):
    out = run_main(
        "bench.throughput.webhooks",
        ["--workdir", str(tmp_path), "--jobs", "3", "--rounds", "1", "--answer-s", "0", "--in-process"],
        capsys,
    )
    row(out, "none", "0")
    for way in ("webhooks", "in-process"):
        cells = [c.strip() for c in row(out, way, "0").strip("|").split("|")]
        assert cells[-2] == "6" and cells[-1] in ("", "0"), cells  # start and completed of each job delivered, none given up


def test_nodes(pg_server, tmp_path, capsys):
    out = run_main(
        "bench.throughput.nodes",
        ["--only", "trials", "--only", "claim", "--trials", "1", "--lease", "1", "--runners", "2", "--apis", "1"]
        + ["--submit-every", "0.5", "--queued", "40", "--claims", "3", "--workdir", str(tmp_path)],
        capsys,
        pg=pg_server,
    )
    cells = [c.strip() for c in row(out, "1").strip("|").split("|")]
    assert cells[3:6] == ["0", "0", "0"] and cells[-1] == "clean", cells  # lost, stuck, two terminals; verify
    for store in ("sqlite", "postgres"):
        for case in ("none (one runner)", "a node's, every job fits", "a node's, first half too long"):
            row(out, store, case)


def test_pipeline(tiny_model, tmp_path, capsys):
    out = run_main(
        "bench.throughput.pipeline",
        ["--model-dir", str(tiny_model), "--size", "32x32", "--frames", "6", "--steps", "1", "--workdir", str(tmp_path)]
        + ["--seq", "64", "--kernels", "MATH"],
        capsys,
    )
    for job in ("cold: load + first job", "warm, new prompt", "warm, same prompt"):
        row(out, job)
    assert "0 (cached)" in row(out, "warm, same prompt")
    row(out, "math")  # measured in a process of its own (`python -m bench.throughput.pipeline --one-call`)


def test_quality(tiny_model, capsys):
    out = run_main(
        "bench.throughput.quality",
        ["--model-dir", str(tiny_model), "--attention", "flash", "--size", "32x32", "--frames", "6", "--steps", "3"],
        capsys,
    )
    for level in ("exact", "balanced", "fast"):
        row(out, level)
    assert "1.00x" in row(out, "exact")


def test_crash_jobs(tmp_path, capsys):
    out = run_main(
        "bench.crash.jobs",
        ["--workdir", str(tmp_path), "--trials", "1", "--kinds", "random,after_commit", "--jobs", "2", "--steps", "2"],
        capsys,
    )
    columns = ["trials", "jobs", "kills", "lost", "stuck", "interrupted", "unrecorded", "adopted", "rerun"]
    columns += ["finished_discarded", "part_left", "garbage", "verify_failed"]
    for kind in ("random", "after_commit"):
        got = dict(zip(columns, [c.strip() for c in row(out, kind).strip("|").split("|")][1:], strict=True))
        assert got["lost"] == got["stuck"] == got["finished_discarded"] == got["verify_failed"] == "0", got
    assert got["adopted"] == got["unrecorded"] == "1", got  # the video committed at the kill, adopted


def test_crash_s3_nodes(pg_server, seaweed, tmp_path, capsys):
    argv = ["--workdir", str(tmp_path), "--trials", "1", "--kinds", "mid_upload", "--nodes", "2", "--jobs", "2"]
    out = run_main("bench.crash.s3_nodes", [*argv, "--steps", "1"], capsys, pg=pg_server, server=seaweed)
    rows = [[c.strip() for c in r.strip("|").split("|")] for r in re.findall(r"^\| mid_upload +\| at_once .*$", out, re.M)]
    assert len(rows) == 2, out[-4000:]  # the jobs table's row, then the killed attempts'
    jobs = ["trials", "jobs", "lost", "stuck", "exits", "verify", "uploads", "after gc", "gc removed", "staged left", "back s"]
    got = dict(zip(jobs, rows[0][2:], strict=True))
    assert got["lost"] == got["stuck"] == got["verify"] == got["uploads"] == got["staged left"] == "0", got
    killed = ["held", "staged at kill", "uploads at kill", "finished", "adopted own", "adopted other", "rerun fin"]
    got = dict(zip([*killed, "rerun unfin"], rows[1][2:], strict=True))
    assert got["held"] == got["uploads at kill"] == got["adopted own"] == "1", got  # the upload a kill cut, adopted


def test_crash_webhooks(tmp_path, capsys):
    out = run_main(
        "bench.crash.webhooks",
        ["--workdir", str(tmp_path), "--trials", "1", "--jobs", "2", "--steps", "2", "--step-seconds", "0.02", "--wait", "60"],
        capsys,
    )
    columns = ["terminal", "after restart", "lost", "repeats", "repeats differing", "unknown ids", "delivering", "orphans"]
    got = dict(zip(columns, [c.strip() for c in row(out, "all").strip("|").split("|")][1:], strict=True))
    assert got["terminal"] == "2" and got["lost"] == got["repeats differing"] == got["unknown ids"] == got["orphans"] == "0"


def test_crash_fleet_faults(tmp_path, capsys):
    # A PostgreSQL of its own (the bench starts it): the fault ends every session of its server.
    out = run_main(
        "bench.crash.fleet_faults",
        ["--kinds", "terminate_backends", "--trials", "1", "--runners", "2", "--streams", "1", "--seconds", "3"]
        + ["--rate", "2", "--recover", "2", "--drain", "10", "--deliver", "3", "--workdir", str(tmp_path)],
        capsys,
    )
    columns = ["n", "acked", "lost", "stuck", "2 ends", "verify", "201 back s", "5xx/4xx/none"]
    columns += ["hooks missing", "after end", "hook max s", "cut/unf/gap", "exits"]
    got = dict(zip(columns, [c.strip() for c in row(out, "terminate_backends", "0").strip("|").split("|")][1:], strict=True))
    assert int(got["acked"]) > 0 and got["lost"] == got["2 ends"] == "0" and got["verify"] == "clean", got
    verdict = [c.strip() for c in row(out, "terminate_backends", "1").strip("|").split("|")][-1]
    assert verdict in ("pass", "FAIL")  # the fixes' verdict: the bench reports it, the smoke run does not judge it


def test_submit_against_this_checkout(tmp_path, capsys):
    # The A/B machinery with this checkout on both sides (`--against-path`): no git worktree made.
    out = run_main(
        "bench.studies.submit",
        ["--against", "HEAD", "--against-path", str(ROOT), "--rounds", "1", "--submits", "4", "--warmup", "2"]
        + ["--roles", "api", "--workdir", str(tmp_path)],
        capsys,
    )
    assert "(this checkout)" in row(out, "api")
    row(out, "api", "HEAD")


def test_submit_ir_dry_run(tmp_path, capsys):
    # No valgrind: the children, their handshake and the feature variants, nothing counted.
    out = run_main(
        "bench.studies.submit_ir",
        ["--dry-run", "--against", "HEAD", "--against-path", str(ROOT), "--submits", "3", "--server-roles", ""]
        + ["--workdir", str(tmp_path)],
        capsys,
    )
    row(out, "HEAD", "as it is", "dry run: not counted")
    assert len(re.findall(r"^\|.*\| as it is +\| +dry run: not counted", out, re.M)) == 2  # this checkout's row too


def test_comfyui_against_the_fake(tmp_path, capsys):
    from h3core.testing.comfyui import FakeComfyUI

    with FakeComfyUI(tmp_path / "comfyui").running_in_thread() as comfy:
        comfy.node_seconds = 0.2  # a job of about a second, as the real server's: the restart finds it running
        out = run_main("bench.studies.comfyui", ["--url", comfy.url, "--trials", "2", "--slots", "2", "--jobs", "2"], capsys)
    row(out, "jobs `cancelled` whose prompt ComfyUI still held right after", "0")
    row(out, "prompts that succeeded after their job was `cancelled`", "0")
    assert re.search(r"^\| jobs done +\| +2 of 2 in ", out, re.M)
    assert "on attempt 1" in row(out, "the job after the restart")


# -- Ray: groups of rank actors on the CPU; run with the other Ray tests, one at a time -------------


def run_module(module: str, argv: list[str], timeout: float = 600) -> str:
    """`python -m module argv` in a process of its own (a Ray driver must not outlive its test here)."""
    done = subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert re.search(r"^\| CPU +\| .+ logical cores", done.stdout, re.M), done.stdout[:2000]
    return done.stdout


@pytest.mark.ray
def test_groups(tiny_model):
    out = run_module(
        "bench.throughput.groups", ["--model-dir", str(tiny_model), "--configs", "fsdp", "--jobs", "1", "--steps", "2"]
    )
    row(out, "fsdp")  # cold start, jobs, collectives
    row(out, "fsdp", "0")
    row(out, "fsdp", "1")  # memory per rank
    assert len(re.findall(r"^\| fsdp +\|", out, re.M)) == 4  # and the rebuild after rank 1 was killed


@pytest.mark.ray
def test_rank_priority(tiny_model, capsys):
    out = run_main("bench.studies.rank_priority", ["--hogs", "0", "--model-dir", str(tiny_model)], capsys)
    row(out, "0", "15", "15")  # each row's ranks run at the niceness asked
    row(out, "0", "0", "0")


@pytest.mark.ray
def test_ray_idle(tiny_model, capsys):
    out = run_main("bench.studies.ray_idle", ["--idle", "1", "--jobs", "1", "--model-dir", str(tiny_model)], capsys)
    cells = [c.strip() for c in row(out, "1").strip("|").split("|")]
    assert cells[2] == "yes" and cells[5].startswith("done") and cells[6:] == ["yes", "0"], cells


def test_crash_checkpoints(tmp_path, capsys, tiny_model):
    # One interruption (two worker starts): the rows of the others are the same code with other arguments.
    argv = ["--workdir", str(tmp_path), "--model-dir", str(tiny_model), "--steps", "12", "--every", "2"]
    argv += ["--size", "32", "--frames", "22", "--runs", "SIGKILL:every"]
    out = run_main("bench.crash.checkpoints", argv, capsys)
    assert row(out, "32x32, 22 frames")
    crash = [c.strip() for c in row(out, "SIGKILL (a crash)", "every 2 steps").strip("|").split("|")]
    assert int(crash[3]) >= 2 and crash[-1] == "2 of 2", "a crash continues from a checkpoint, and spends an attempt"


def test_throughput_idle_connections(tmp_path, capsys):
    out = run_main("bench.throughput.idle_connections", ["--idle", "0,20", "--probes", "5", "--workdir", str(tmp_path)], capsys)
    for idle in ("0", "20"):
        assert "200 x5" in row(out, idle), "every probe answered while the idle connections were open"


def test_throughput_videos_list(tmp_path, capsys):
    argv = ["--deleted", "10", "--kept", "3", "--probes", "3", "--workdir", str(tmp_path)]
    out = run_main("bench.throughput.videos_list", argv, capsys)
    assert row(out, "10", "/v1/videos?limit=1") and row(out, "0", "/v1/videos?limit=1")


def test_studies_upload_bomb_against_this_checkout(tmp_path, capsys):
    out = run_main("bench.studies.upload_bomb", ["--against", "HEAD", "--samples", "1e5", "--workdir", str(tmp_path)], capsys)
    assert "100,000 samples" in out


def test_throughput_segments(capsys):
    from bench.throughput import segments

    segments.main(["--seconds", "3", "--window", "1", "--steps", "2", "--repeats", "1", "--size", "64x64"])
    out = capsys.readouterr().out
    assert "| segments      |    1 |        4 |" in out and "| separate jobs |    4 |" in out


def test_throughput_segments_assembly(capsys):
    """The GPU check's step 7c, at the size its dry run uses."""
    from bench.throughput import segments

    segments.main(["--assembly", "--size", "128x64", "--seconds", "3", "--window", "1"])
    out = capsys.readouterr().out
    assert "plan: 4 segments" in out and "| join " in out and "a remux of the video" in out
