"""The fake ComfyUI (`h3core/testing/comfyui/`): replayed against real recordings, and its fault switches.

The FIDELITY tests replay each scenario recorded from a real ComfyUI 0.3.64
(`h3core/testing/comfyui_protocol/samples/*.json`, copied from the recording) and compare:
status codes, content types, JSON bodies and websocket message-type sequences. They normalise only
what the fake cannot know or what differs run to run (see `norm`):
- prompt ids, client ids and `sid`s (uuids / 32-hex strings) and `timestamp`s;
- `number`: the recording comes from one long session (numbers 0..23), each test starts a fresh server;
- file counters (`probe_00002_` vs `probe_00001_`: the real output folder held older files) and the
  5-letter random part of PreviewImage names;
- tracebacks: same shape (a list of "  File ..." strings), not the same frames.
Where `status` broadcasts interleave with the worker's messages depending on timing (04), the
worker's messages are compared in order and the status counts separately.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import connect

from h3core.testing.comfyui import PROTOCOL, FakeComfyUI, png_bytes

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]
SAMPLES = PROTOCOL / "samples"
WORKFLOWS = REPO / "h3core" / "executors" / "comfyui" / "workflows"

_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9a-f]{32}\b")


def sample(name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / f"{name}.json").read_text())


def norm(x: Any, drop: frozenset[str] = frozenset({"traceback"})) -> Any:
    """Mask what differs run to run (module docstring)."""
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k == "timestamp":
                out[k] = "<ts>"
            elif k in drop:
                assert isinstance(v, list) and all(isinstance(s, str) and s.startswith("  File ") for s in v), v
                out[k] = "<traceback>"
            elif k == "number":
                out[k] = "<n>"
            else:
                out[_ID.sub("<id>", k)] = norm(v, drop)
        return out
    if isinstance(x, list):
        if len(x) == 5 and isinstance(x[0], int | float) and isinstance(x[1], str) and isinstance(x[2], dict):
            return ["<n>", *norm(x[1:], drop)]  # a queue item: [number, prompt_id, prompt, extra_data, outputs]
        return [norm(v, drop) for v in x]
    if isinstance(x, str):
        x = _ID.sub("<id>", x)
        x = re.sub(r"_temp_[a-z]{5}_", "_temp_<rnd>_", x)
        return re.sub(r"_\d{5}_\.", "_<n>_.", x)
    return x


def kind(m: Any) -> str:
    if isinstance(m, bytes):
        return f"<binary ev={struct.unpack('>I', m[:4])[0]}>"
    return m["type"]


class Socket:
    """A websocket client that records everything it receives."""

    def __init__(self, url: str, *, feature_flags: bool = False) -> None:
        self.url, self.feature_flags = url, feature_flags
        self.messages: list[Any] = []
        self.closed = False

    async def __aenter__(self) -> Socket:
        self.conn = await connect(self.url, max_size=None)
        if self.feature_flags:
            await self.conn.send(json.dumps({"type": "feature_flags", "data": {"supports_preview_metadata": True}}))
        self._task = asyncio.create_task(self._read())
        await self.wait(lambda: self.messages)  # the first `status`, with our sid
        return self

    async def _read(self) -> None:
        try:
            async for raw in self.conn:
                self.messages.append(json.loads(raw) if isinstance(raw, str) else raw)
        except websockets.ConnectionClosed:
            pass
        self.closed = True

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()
        self._task.cancel()

    @property
    def sid(self) -> str:
        return self.messages[0]["data"]["sid"]

    def types(self) -> list[str]:
        return [kind(m) for m in self.messages]

    def json(self, type_: str | None = None) -> list[dict[str, Any]]:
        return [m for m in self.messages if isinstance(m, dict) and (type_ is None or m["type"] == type_)]

    async def wait(self, predicate, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out; got {self.types()}"
            await asyncio.sleep(0.005)

    def ended(self, prompt_id: str) -> bool:
        return any(m["data"] == {"node": None, "prompt_id": prompt_id} for m in self.json("executing"))

    async def wait_end(self, prompt_id: str, timeout: float = 10.0) -> None:
        await self.wait(lambda: self.ended(prompt_id), timeout)

    def executing(self, node: str, prompt_id: str | None = None) -> bool:
        return any(
            m["data"].get("node") == node and (prompt_id is None or m["data"].get("prompt_id") == prompt_id)
            for m in self.json("executing")
        )


@pytest.fixture
async def comfy(tmp_path):
    async with FakeComfyUI(tmp_path / "comfy") as fake:
        yield fake


@pytest.fixture
async def http(comfy):
    async with httpx.AsyncClient(base_url=comfy.url, timeout=10) as client:
        yield client


def check_response(recorded: dict[str, Any], response: httpx.Response, *, body: bool = True) -> None:
    assert response.status_code == recorded["status"]
    assert response.headers.get("content-type") == recorded["content_type"]
    if body and "json" in recorded:
        got = response.json() if response.content else None
        assert norm(got) == norm(recorded["json"])
    if "text" in recorded:
        assert response.text == recorded["text"]


async def replay(http: httpx.AsyncClient, recorded: dict[str, Any], **kw: Any) -> httpx.Response:
    request = recorded["request"]
    if "json" in request:
        kw.setdefault("json", request["json"])
    return await http.request(request["method"], request["path"], **kw)


async def submit(http: httpx.AsyncClient, graph: dict[str, Any], client_id: str | None = None, **extra: Any) -> str:
    body: dict[str, Any] = {"prompt": graph, **extra}
    if client_id is not None:
        body["client_id"] = client_id
    r = await http.post("/prompt", json=body)
    assert r.status_code == 200 and r.json()["node_errors"] == {}, r.text
    return r.json()["prompt_id"]


async def history(http: httpx.AsyncClient, prompt_id: str) -> dict[str, Any]:
    return (await http.get(f"/history/{prompt_id}")).json().get(prompt_id, {})


async def wait_history(comfy: FakeComfyUI, prompt_id: str, timeout: float = 10.0) -> dict[str, Any]:
    await comfy.wait_for(lambda: prompt_id in comfy.history, timeout)
    return comfy.history[prompt_id]


def probe(prefix: str = "probe", color: int = 16711680, batch: int = 1) -> dict[str, Any]:
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": batch, "color": color}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


def template(name: str, steps: int | None = None) -> dict[str, Any]:
    graph = json.loads((WORKFLOWS / f"{name}.json").read_text())["graph"]
    if steps is not None:
        graph["9"]["inputs"]["steps"] = steps
    return graph


def add_media(comfy: FakeComfyUI) -> None:
    """The files the templates' loaders name (only their existence is checked by the fake)."""
    inp = comfy.root / "input"
    for name in ["first.png", "last.png", *(f"ref_{i}.png" for i in range(9))]:
        (inp / name).write_bytes(png_bytes(32, 32))
    for i in range(3):
        (inp / f"ref_{i}.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
        (inp / f"ref_{i}.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt ")


# -- FIDELITY: replays of the recorded scenarios ----------------------------------------------------------------


async def test_01_basic_and_02_cached_resubmit(comfy, http):
    rec = sample("01_basic")
    client_id = rec["prompt_post"]["request"]["json"]["client_id"]
    async with Socket(comfy.ws_url(client_id)) as ws:
        r = await replay(http, rec["prompt_post"])
        check_response(rec["prompt_post"], r)
        prompt_id = r.json()["prompt_id"]
        await ws.wait_end(prompt_id)
        assert ws.types() == rec["ws_sequence"]
        assert ws.messages[0] == {"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": client_id}}
        assert norm(ws.messages) == norm([m["msg"] for m in rec["ws_messages"]])
        h = await http.get(rec["history"]["request"]["path"].replace(rec["prompt_post"]["json"]["prompt_id"], prompt_id))
        check_response(rec["history"], h)
        ref = h.json()[prompt_id]["outputs"]["2"]["images"][0]
        view = await http.get("/view", params={"filename": ref["filename"], "subfolder": "", "type": "output"})
        assert view.status_code == 200 and view.headers["content-type"] == rec["view"]["content_type"]
        assert view.headers["content-disposition"] == f'filename="{ref["filename"]}"'
        assert view.content[:16].hex() == rec["view"]["body_head_hex"]

    # 02: the identical prompt again: everything cached, `executed` replayed with the same file.
    rec2 = sample("02_cached_resubmit")
    async with Socket(comfy.ws_url(client_id)) as ws:
        r = await replay(http, rec2["prompt_post"])
        check_response(rec2["prompt_post"], r)
        prompt_id2 = r.json()["prompt_id"]
        await ws.wait_end(prompt_id2)
        assert ws.types() == rec2["ws_sequence"]
        assert norm(ws.messages) == norm([m["msg"] for m in rec2["ws_messages"]])
        check_response(rec2["history"], await http.get(f"/history/{prompt_id2}"))
        assert (await history(http, prompt_id2))["outputs"] == (await history(http, prompt_id))["outputs"]
    assert sorted(p.name for p in (comfy.root / "output").iterdir()) == [ref["filename"]]  # no new file


async def test_03_progress_and_binary_previews(comfy, http):
    rec = sample("03_progress_binary")
    for case, flags in (("legacy", False), ("feature_flags", True)):
        r = rec[case]
        client_id = r["prompt_post"]["request"]["json"]["client_id"]
        async with Socket(comfy.ws_url(client_id), feature_flags=flags) as ws:
            if flags:
                await ws.wait(lambda: len(ws.messages) >= 2)
                assert ws.messages[1] == r["ws_messages"][1]["msg"]  # the server's feature_flags answer
            resp = await replay(http, r["prompt_post"])
            check_response(r["prompt_post"], resp)
            prompt_id = resp.json()["prompt_id"]
            await ws.wait_end(prompt_id)
            assert ws.types() == r["ws_sequence"], case
            recorded_json = [m["msg"] for m in r["ws_messages"] if "msg" in m]
            assert norm(ws.json()) == norm(recorded_json)
            recorded_bin = [m for m in r["ws_messages"] if m.get("binary")]
            got_bin = [m for m in ws.messages if isinstance(m, bytes)]
            for want, got in zip(recorded_bin, got_bin, strict=True):
                assert struct.unpack(">I", got[:4])[0] == want["event_type"]
                if want["event_type"] == 1:
                    assert struct.unpack(">I", got[4:8])[0] == want["image_type"]
                    assert got[8:16].hex() == want["image_magic_hex"]
                else:
                    n = struct.unpack(">I", got[4:8])[0]
                    assert n == want["metadata_len"]  # same keys and layout: same length
                    assert norm(json.loads(got[8 : 8 + n])) == norm(want["metadata"])
                    assert got[8 + n : 16 + n].hex() == want["image_magic_hex"]
        if "history" in r:
            check_response(r["history"], await http.get(f"/history/{prompt_id}"))


async def test_04_interrupt_front_and_delete(comfy, http):
    rec = sample("04_interrupt_queue")
    client_id = rec["post_running"]["request"]["json"]["client_id"]
    comfy.node_seconds = 0.5  # the recorded EmptyImage 1024x1024x200 took 7 s; the requests below land inside it
    async with Socket(comfy.ws_url(client_id)) as ws:
        running = (await replay(http, rec["post_running"])).json()["prompt_id"]
        await ws.wait(lambda: ws.executing("1"))
        pending = await replay(http, rec["post_pending"])
        check_response(rec["post_pending"], pending)
        front = await replay(http, rec["post_front"])
        check_response(rec["post_front"], front)
        assert front.json()["number"] == -(pending.json()["number"] + 1) < 0
        check_response(rec["queue_while_running"], await http.get("/queue"))
        check_response(rec["get_prompt_while_running"], await http.get("/prompt"))
        delete = rec["delete_pending"]
        r = await http.post("/queue", json={"delete": [pending.json()["prompt_id"]]})
        check_response(delete, r)
        assert r.content == b""
        check_response(rec["queue_after_delete"], await http.get("/queue"))
        check_response(rec["interrupt_other_prompt_id"], await replay(http, rec["interrupt_other_prompt_id"]))
        check_response(rec["interrupt"], await http.post("/interrupt", json={"prompt_id": running}))
        comfy.node_seconds = 0.0
        await ws.wait_end(front.json()["prompt_id"])

        def worker(types: list[str]) -> list[str]:
            return [t for t in types if t != "status"]

        assert worker(ws.types()) == worker(rec["ws_sequence"])
        statuses = [m["data"]["status"]["exec_info"]["queue_remaining"] for m in ws.json("status")]
        recorded = [
            m["msg"]["data"]["status"]["exec_info"]["queue_remaining"] for m in rec["ws_messages"] if m["msg"]["type"] == "status"
        ]
        assert statuses == recorded == [0, 1, 1, 2, 3, 2, 1, 1, 0]
        interrupted = ws.json("execution_interrupted")[0]["data"]
        assert {k: v for k, v in interrupted.items() if k != "timestamp"} == {
            "prompt_id": running,
            "node_id": "2",
            "node_type": "SaveImageWebsocket",
            "executed": ["1"],
        }
    check_response(rec["history_interrupted"], await http.get(f"/history/{running}"))
    check_response(rec["history_deleted"], await http.get(f"/history/{pending.json()['prompt_id']}"))
    check_response(rec["history_front"], await http.get(f"/history/{front.json()['prompt_id']}"))
    check_response(rec["queue_after"], await http.get("/queue"))


async def test_05_interrupt_lands_between_list_items_of_a_slow_node(comfy, http):
    rec = sample("05_interrupt_slow_node")
    comfy.node_seconds = 0.05  # ImageScale runs once per item of RebatchImages' list (16 items)
    client_id = uuid.uuid4().hex
    async with Socket(comfy.ws_url(client_id)) as ws:
        prompt_id = await submit(http, rec["workflow"], client_id)
        await ws.wait(lambda: ws.executing("3"))
        started = time.monotonic()
        check_response(rec["interrupt"], await http.post("/interrupt"))
        await ws.wait_end(prompt_id)
        assert time.monotonic() - started < 0.5
        assert ws.types() == rec["ws_sequence"]
        assert norm(ws.json()) == norm([m["msg"] for m in rec["ws_messages"]])
    check_response(rec["history"], await http.get(f"/history/{prompt_id}"))

    rec = sample("05_interrupt_slow_node_uninterrupted")
    comfy.node_seconds = 0.0
    async with Socket(comfy.ws_url(client_id)) as ws:
        prompt_id = await submit(http, rec["workflow"], client_id)
        await ws.wait_end(prompt_id)
        assert ws.types() == rec["ws_sequence"]
        assert norm(ws.json()) == norm([m["msg"] for m in rec["ws_messages"]])
    check_response(rec["history"], await http.get(f"/history/{prompt_id}"))
    assert len(comfy.history[prompt_id]["outputs"]["5"]["images"]) == 16


async def test_06_invalid_prompts_answer_exactly_like_comfyui(comfy, http):
    rec = sample("06_invalid_prompts")
    for name, case in rec.items():
        if name == "invalid_json_body":
            r = await http.post("/prompt", content=b"{not json", headers={"content-type": "application/json"})
        else:
            r = await replay(http, case)
        check_response(case, r)
        if name == "link_to_missing_node":  # the traceback is a list of frames, like the recorded one
            tb = r.json()["node_errors"]["2"]["errors"][0]["extra_info"]["traceback"]
            assert tb and all(s.startswith("  File ") for s in tb)
    # `number` went up on every POST that got past JSON decoding, rejected or not (13 of the 14).
    assert (await http.post("/prompt", json={"prompt": probe()})).json()["number"] == 13


async def test_06_partially_valid_prompt_runs_only_its_valid_outputs(comfy, http):
    case = sample("06_invalid_prompts")["two_outputs_one_bad"]
    r = await replay(http, case)
    check_response(case, r)
    entry = await wait_history(comfy, r.json()["prompt_id"])
    assert entry["prompt"][4] == ["2"] and list(entry["outputs"]) == ["2"]
    assert entry["status"]["status_str"] == "success"


async def test_07_runtime_error(comfy, http):
    rec = sample("07_runtime_error")
    client_id = rec["prompt_post"]["request"]["json"]["client_id"]
    async with Socket(comfy.ws_url(client_id)) as ws:
        r = await replay(http, rec["prompt_post"])
        check_response(rec["prompt_post"], r)
        await ws.wait_end(r.json()["prompt_id"])
        assert ws.types() == rec["ws_sequence"]
        assert norm(ws.json()) == norm([m["msg"] for m in rec["ws_messages"]])
    check_response(rec["history"], await http.get(f"/history/{r.json()['prompt_id']}"))


async def test_08_uploads_view_and_loadimage(comfy, http):
    rec = sample("08_upload")
    a, b = png_bytes(8, 8, 0x123456), png_bytes(8, 8, 0x654321)
    name = "upl_537ee2.png"
    uploads = {
        "upload_default": ({"image": (name, a, "image/png")}, {}),
        "upload_same_bytes_again": ({"image": (name, a, "image/png")}, {}),
        "upload_same_name_diff_bytes": ({"image": (name, b, "image/png")}, {}),
        "upload_overwrite_true": ({"image": (name, a, "image/png")}, {"overwrite": "true"}),
        "upload_temp_subfolder": ({"image": (name, a, "image/png")}, {"type": "temp", "subfolder": "probe_sub"}),
        "upload_path_escape": ({"image": (name, a, "image/png")}, {"subfolder": "../../escape"}),
        "upload_no_image_field": ({"other": ("x.bin", b"x")}, {"type": "input"}),
    }
    for key, (files, data) in uploads.items():
        r = await http.post("/upload/image", files=files, data=data)
        check_response(rec[key], r)
    assert (comfy.root / "input" / name).read_bytes() == a
    assert (comfy.root / "temp" / "probe_sub" / name).is_file()
    for key in ("view_uploaded_input", "view_missing", "view_no_filename", "view_traversal"):
        r = await http.get(rec[key]["request"]["path"])
        check_response(rec[key], r)
        assert len(r.content) == (len(a) if key == "view_uploaded_input" else 0)
    assert (await http.get("/view", params={"filename": name, "type": "bogus"})).status_code == 400
    assert (await http.get("/view", params={"filename": name, "type": "input", "subfolder": "../output"})).status_code == 403
    assert (await http.get("/view", params={"filename": name, "type": "temp", "subfolder": "probe_sub"})).status_code == 200
    info = (await http.get("/object_info/LoadImage")).json()
    want = rec["object_info_LoadImage_after_upload"]["json"]
    assert info["LoadImage"]["input"]["required"]["image"][0] == [
        n for n in want["LoadImage"]["input"]["required"]["image"][0] if n.startswith("upl_537ee2")
    ]
    info["LoadImage"]["input"]["required"]["image"][0] = want["LoadImage"]["input"]["required"]["image"][0]
    assert info == want  # the same spec, listing this server's files

    wf = rec["loadimage_workflow"]
    client_id = wf["prompt_post"]["request"]["json"]["client_id"]
    async with Socket(comfy.ws_url(client_id)) as ws:
        r = await replay(http, wf["prompt_post"])
        check_response(wf["prompt_post"], r)
        await ws.wait_end(r.json()["prompt_id"])
        assert ws.types() == wf["ws_sequence"]  # PreviewImage (an output node) runs as soon as it can
        assert norm(ws.json()) == norm([m["msg"] for m in wf["ws_messages"]])
    check_response(rec["loadimage_history"], await http.get(f"/history/{r.json()['prompt_id']}"))


async def test_09_misc_endpoints_and_who_receives_what(comfy, http):
    rec = sample("09_misc")
    for key in (
        "GET /queue",
        "GET /prompt",
        "GET /features",
        "GET /history/does-not-exist",
        "GET /object_info/EmptyImage",
        "GET /object_info/NoSuchNode",
        "GET /embeddings",
        "GET /models",
        "GET /models/checkpoints",
    ):
        check_response(rec[key], await replay(http, rec[key]))
    check_response(rec["GET /extensions"], await http.get("/extensions"), body=False)  # no frontend here: []
    for path in ("/api/prompt", "/api/history", "/api/system_stats", "/api/object_info/EmptyImage"):
        assert (await http.get(path)).status_code == 200

    # A prompt without client_id: only `status` and (broadcast) `progress_state` reach any socket.
    async with Socket(comfy.ws_url()) as bystander:
        assert re.fullmatch(r"[0-9a-f]{32}", bystander.sid)  # made up by the server, as uuid4().hex
        case = rec["post_custom_prompt_id_no_client_id"]
        r = await replay(http, case)
        check_response(case, r)
        assert r.json()["prompt_id"] == case["request"]["json"]["prompt_id"]  # ours, honoured
        await wait_history(comfy, r.json()["prompt_id"])
        await bystander.wait(lambda: len(bystander.messages) >= len(rec["bystander_ws_messages"]))
        assert norm(bystander.json()) == norm([m["msg"] for m in rec["bystander_ws_messages"]])
        check_response(rec["history_custom"], await http.get(f"/history/{r.json()['prompt_id']}"))

    # Another client's prompt: a bystander sees only `status`.
    async with Socket(comfy.ws_url()) as bystander, Socket(comfy.ws_url("owner")) as owner:
        prompt_id = await submit(http, probe("other", color=0x00FF00), "owner")  # nothing cached
        await owner.wait_end(prompt_id)
        assert owner.types() == rec["other_client_prompt_owner_sequence"]
        await bystander.wait(lambda: len(bystander.messages) >= 4)
        assert norm(bystander.json()) == norm([m["msg"] for m in rec["other_client_prompt_bystander_msgs"]])

    h = (await http.get("/history", params={"max_items": 2})).json()
    assert list(h) == list(comfy.history)[-2:]
    everything = (await http.get("/history")).json()
    assert list(everything) == list(comfy.history) and len(everything) == 2
    for key in ("POST /history delete custom", "POST /queue clear", "POST /interrupt no body", "POST /free"):
        check_response(rec[key], await replay(http, rec[key]))
    check_response(
        rec["GET /history/custom after delete"], await http.get(rec["GET /history/custom after delete"]["request"]["path"])
    )
    # ComfyUI refuses a loopback Host with a foreign Origin (its CSRF guard).
    assert (await http.get("/queue", headers={"Origin": "http://evil.example"})).status_code == 403
    assert (await http.get("/queue", headers={"Origin": comfy.url})).status_code == 200
    stats = (await http.get("/system_stats")).json()
    assert set(stats) == {"system", "devices"} and stats["system"]["comfyui_version"] == "0.3.64"


async def test_10_reconnect_with_the_same_client_id_takes_over(comfy, http):
    rec = sample("10_reconnect_same_clientId")
    cid = uuid.uuid4().hex
    comfy.step_seconds = 0.02
    wf = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 60, "color": 0}},
        "2": {"class_type": "SaveImageWebsocket", "inputs": {"images": ["1", 0]}},
    }
    async with Socket(comfy.ws_url(cid)) as a:
        prompt_id = await submit(http, wf, cid)
        await a.wait(lambda: any(m["data"]["value"] >= 14 for m in a.json("progress")))
        async with Socket(comfy.ws_url(cid)) as b:
            await b.wait_end(prompt_id)
            assert not a.closed  # the old socket stays open, but gets nothing more
            head, tail = rec["B_sequence_head"], rec["B_sequence_tail"]
            assert b.types()[: len(head)] == head and b.types()[-len(tail) :] == tail
            assert norm(b.messages[:2]) == norm([m["msg"] for m in rec["B_first_msgs"][:2]])
            assert b.messages[1] == {"type": "executing", "data": {"node": "2"}}
            last_a = a.json("progress")[-1]["data"]["value"]
            first_b = b.json("progress")[0]["data"]["value"]
            assert first_b == last_a + 1  # no message went to both, none was lost
    assert comfy.history[prompt_id]["status"]["status_str"] == "success"


# -- behaviour beyond the recordings -------------------------------------------------------------------------------


async def test_all_six_builtin_templates_are_accepted_and_write_a_real_mp4(comfy, http):
    import av

    add_media(comfy)
    comfy.step_seconds = 0.0
    names = sorted(p.stem for p in WORKFLOWS.glob("minimax-h3-*.json"))
    assert len(names) == 6
    for name in names:
        prompt_id = await submit(http, template(name, steps=3), "tpl")
        entry = await wait_history(comfy, prompt_id, timeout=20)
        assert entry["status"]["status_str"] == "success", (name, entry["status"])
        out = entry["outputs"]["14"]
        ref = out["images"][0]
        assert out["animated"] == [True] and ref["subfolder"] == "video" and ref["type"] == "output"
        assert re.fullmatch(r"MiniMax_H3_\d{5}_\.mp4", ref["filename"])
        view = await http.get("/view", params=ref)
        assert view.status_code == 200 and view.headers["content-type"] == "video/mp4"
    files = sorted((comfy.root / "output" / "video").iterdir())
    assert [p.name for p in files] == [f"MiniMax_H3_{i:05}_.mp4" for i in range(1, 7)]  # the counter goes up
    with av.open(str(files[0])) as container:
        assert container.streams.video[0].frames == 124 and len(container.streams.audio) == 1


async def test_the_model_free_template_runs_and_writes_the_frames_it_was_given(comfy, http):
    import av

    graph = json.loads((WORKFLOWS / "core-nodes-t2va.json").read_text())["graph"]
    graph["1"]["inputs"]["batch_size"] = 37
    entry = await wait_history(comfy, await submit(http, graph, "core"), timeout=20)
    assert entry["status"]["status_str"] == "success", entry["status"]
    ref = entry["outputs"]["7"]["images"][0]
    assert ref["subfolder"] == "h3core" and ref["filename"].endswith(".mp4")
    with av.open(str(comfy.root / "output" / "h3core" / ref["filename"])) as container:
        assert container.streams.video[0].frames == 37


async def test_a_missing_input_file_is_a_custom_validation_error(comfy, http):
    r = await http.post("/prompt", json={"prompt": template("minimax-h3-ref2va-single-gpu"), "client_id": "x"})
    assert r.status_code == 400
    errors = r.json()["node_errors"]
    assert errors["30"]["errors"][0]["details"] == "image - Invalid image file: ref_0.png"
    assert errors["400"]["errors"][0] == {
        "type": "custom_validation_failed",
        "message": "Custom validation failed for node",
        "details": "file - Invalid video file: ref_0.mp4",
        "extra_info": {"input_name": "file"},
    }
    assert errors["50"]["errors"][0]["details"] == "audio - Invalid audio file: ref_0.wav"
    assert errors["400"]["dependent_outputs"] == ["14"]


async def test_validation_of_the_minimax_nodes(comfy, http):
    graph = template("minimax-h3-t2va-single-gpu")
    graph["5"]["inputs"]["length"] = 2
    graph["9"]["inputs"]["scheduler"] = "nope"
    graph["7"]["inputs"]["conditioning"] = ["5", 1]  # a LATENT into a CONDITIONING input
    r = await http.post("/prompt", json={"prompt": graph})
    assert r.status_code == 400
    errors = {n: [e["type"] for e in v["errors"]] for n, v in r.json()["node_errors"].items()}
    assert errors == {"5": ["value_smaller_than_min"], "9": ["value_not_in_list"], "7": ["return_type_mismatch"]}
    comfy.model_files = {"diffusion_models": ["other.safetensors"]}
    r = await http.post("/prompt", json={"prompt": template("minimax-h3-t2va-single-gpu")})
    assert r.status_code == 400 and r.json()["node_errors"]["1"]["errors"][0]["type"] == "value_not_in_list"
    info = (await http.get("/object_info/UNETLoader")).json()["UNETLoader"]
    assert info["input"]["required"]["unet_name"][0] == ["other.safetensors"]


async def test_sampler_progress_counts_one_to_steps_from_the_scheduler(comfy, http):
    comfy.step_seconds = 0.001
    async with Socket(comfy.ws_url("p")) as ws:
        prompt_id = await submit(http, template("minimax-h3-t2va-single-gpu", steps=5), "p")
        await ws.wait_end(prompt_id)
    progress = [m["data"] for m in ws.json("progress")]
    assert progress == [{"value": i, "max": 5, "prompt_id": prompt_id, "node": "10"} for i in range(1, 6)]
    states = [m["data"]["nodes"]["10"] for m in ws.json("progress_state") if "10" in m["data"]["nodes"]]
    assert [(s["value"], s["max"], s["state"]) for s in states][:2] == [(0.0, 1.0, "running"), (1, 5, "running")]
    assert (states[-1]["value"], states[-1]["state"]) == (5, "finished")
    types = ws.types()
    i = types.index("progress")
    assert types[i - 1] == "progress_state"  # each step: progress_state, then progress
    # KSampler counts its own `steps` input.
    ksampler = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "x.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a", "clip": ["1", 1]}},
        "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "4": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "seed": 1,
                "steps": 3,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "positive": ["2", 0],
                "negative": ["2", 0],
                "latent_image": ["3", 0],
                "denoise": 1.0,
            },
        },
        "5": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["1", 2]}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "k"}},
    }
    async with Socket(comfy.ws_url("k")) as ws:
        prompt_id = await submit(http, ksampler, "k")
        await ws.wait_end(prompt_id)
    assert [m["data"]["value"] for m in ws.json("progress")] == [1, 2, 3]


async def test_send_progress_false_sends_no_sampler_ticks_and_interrupt_waits_for_the_node_boundary(comfy, http):
    comfy.send_progress = False
    comfy.step_seconds = 0.01
    async with Socket(comfy.ws_url("r")) as ws:
        prompt_id = await submit(http, template("minimax-h3-t2va-raylight", steps=20), "r")
        await ws.wait_end(prompt_id)
        assert not ws.json("progress")
        states = [m["data"]["nodes"]["10"] for m in ws.json("progress_state") if "10" in m["data"]["nodes"]]
        assert {(s["value"], s["max"]) for s in states} == {(0.0, 1.0), (1.0, 1.0)}
        # No progress hook, no interrupt check inside the sampler: it lands at the next node.
        graph = template("minimax-h3-t2va-raylight", steps=20)
        graph["10"]["inputs"]["noise_seed"] = 1
        prompt_id = await submit(http, graph, "r")
        await ws.wait(lambda: ws.executing("10", prompt_id))
        await http.post("/interrupt", json={"prompt_id": prompt_id})
        await ws.wait_end(prompt_id)
    last = comfy.history[prompt_id]["status"]["messages"][-1]
    assert last[0] == "execution_interrupted" and last[1]["node_id"] != "10" and "10" in last[1]["executed"]


async def test_log_progress_writes_tqdm_lines_for_raylight(tmp_path):
    async with FakeComfyUI(tmp_path, gpus=4) as comfy, httpx.AsyncClient(base_url=comfy.url) as http:
        comfy.log_progress = True
        comfy.send_progress = False
        comfy.step_seconds = 0.001
        prompt_id = await submit(http, template("minimax-h3-t2va-raylight", steps=6))
        await wait_history(comfy, prompt_id)
        text = comfy.log_path.read_bytes().decode()
    assert "\x1b[36m(RayWorker pid=" in text and "got prompt" in text and "Prompt executed in" in text
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    bars = [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+)\s*\[", plain)]
    assert (4, 4) in bars  # the start-up bar counts GPUs
    assert [a for a, b in bars if b == 6] == [i for i in range(1, 7) for _ in range(4)]  # one line per GPU per step
    assert "Loading workers: 100%|" in plain
    # A single-GPU sampler logs a \r-redrawn tqdm bar instead.
    comfy2 = FakeComfyUI(tmp_path / "b")
    comfy2.log_progress = True
    async with comfy2, httpx.AsyncClient(base_url=comfy2.url) as http:
        comfy2.step_seconds = 0.001
        await wait_history(comfy2, await submit(http, template("minimax-h3-t2va-single-gpu", steps=3)))
    assert re.search(r"\r\s*\d+%\|[^\r\n]*\| 3/3 \[", comfy2.log_path.read_bytes().decode())


@pytest.mark.parametrize(
    "switch, exception_type, message",
    [
        (
            "oom_at_step",
            "torch.OutOfMemoryError",
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22.00 GiB",
        ),
        ("error_at_step", "RuntimeError", "boom\n"),
    ],
)
async def test_failure_at_a_sampler_step(comfy, http, switch, exception_type, message):
    setattr(comfy, switch, 3)
    comfy.step_seconds = 0.001
    async with Socket(comfy.ws_url("f")) as ws:
        prompt_id = await submit(http, template("minimax-h3-t2va-single-gpu", steps=5), "f")
        await ws.wait_end(prompt_id)
    assert [m["data"]["value"] for m in ws.json("progress")] == [1, 2]
    assert ws.types()[-3:] == ["execution_error", "status", "executing"]
    entry = comfy.history[prompt_id]
    assert entry["status"]["status_str"] == "error" and entry["status"]["completed"] is False and entry["outputs"] == {}
    name, error = entry["status"]["messages"][-1]
    assert name == "execution_error" and error == ws.json("execution_error")[0]["data"]
    assert error["exception_type"] == exception_type and error["exception_message"].startswith(message)
    assert (error["node_id"], error["node_type"]) == ("10", "SamplerCustomAdvanced")
    assert set(error) == {
        "prompt_id",
        "node_id",
        "node_type",
        "executed",
        "exception_message",
        "exception_type",
        "traceback",
        "current_inputs",
        "current_outputs",
        "timestamp",
    }
    assert error["current_inputs"]["sigmas"] and error["current_outputs"] == list(template("minimax-h3-t2va-single-gpu"))
    assert "9" in error["executed"] and error["traceback"]


async def test_drop_sockets_at_step_closes_every_socket_once_and_the_prompt_goes_on(comfy, http):
    comfy.drop_sockets_at_step = 3
    comfy.step_seconds = 0.02
    async with Socket(comfy.ws_url("d")) as ws, Socket(comfy.ws_url()) as other:
        prompt_id = await submit(http, template("minimax-h3-t2va-single-gpu", steps=10), "d")
        await ws.wait(lambda: ws.closed)
        await other.wait(lambda: other.closed)
        assert [m["data"]["value"] for m in ws.json("progress")] == [1, 2]
        async with Socket(comfy.ws_url("d")) as again:
            await again.wait_end(prompt_id)
            assert again.json("progress")[-1]["data"]["value"] == 10
    assert comfy.drop_sockets_at_step is None
    assert comfy.history[prompt_id]["status"]["status_str"] == "success"


async def test_http_delay_slows_every_answer(comfy, http):
    comfy.http_delay = 0.2
    started = time.monotonic()
    assert (await http.get("/queue")).status_code == 200
    assert time.monotonic() - started >= 0.2
    assert comfy.received[-1] == ("GET", "/queue", None)


async def test_interrupt_by_prompt_id_only_hits_the_running_prompt(comfy, http):
    comfy.step_seconds = 0.02
    async with Socket(comfy.ws_url("i")) as ws:
        first = await submit(http, template("minimax-h3-t2va-single-gpu", steps=50), "i")
        second = await submit(http, probe(), "i")
        await ws.wait(lambda: any(m["data"]["node"] == "10" for m in ws.json("progress")))
        await http.post("/interrupt", json={"prompt_id": second})  # pending, not running: nothing happens
        await http.post("/interrupt", json={"prompt_id": "unknown"})
        await asyncio.sleep(0.05)
        assert comfy.running_prompt_id == first
        await http.post("/interrupt", json={"prompt_id": first})
        await ws.wait_end(second)
    last = comfy.history[first]["status"]["messages"][-1]
    assert last[0] == "execution_interrupted" and last[1]["node_id"] == "10"  # at a progress tick
    assert comfy.history[second]["status"]["status_str"] == "success"
    # A global interrupt while idle does not touch the next prompt (the flag is cleared at its start).
    await http.post("/interrupt")
    third = await submit(http, probe("third"))
    assert (await wait_history(comfy, third))["status"]["status_str"] == "success"


async def test_deleting_the_running_prompt_does_nothing(comfy, http):
    comfy.step_seconds = 0.01
    prompt_id = await submit(http, template("minimax-h3-t2va-single-gpu", steps=20))
    await comfy.wait_for(lambda: comfy.current_step >= 2)
    assert (await http.post("/queue", json={"delete": [prompt_id]})).status_code == 200
    assert (await wait_history(comfy, prompt_id))["status"]["status_str"] == "success"


async def test_history_is_empty_until_the_prompt_finishes(comfy, http):
    comfy.step_seconds = 0.01
    prompt_id = await submit(http, template("minimax-h3-t2va-single-gpu", steps=20))
    await comfy.wait_for(lambda: comfy.current_step >= 1)
    assert (await http.get(f"/history/{prompt_id}")).json() == {}
    running = (await http.get("/queue")).json()["queue_running"]
    assert [item[1] for item in running] == [prompt_id] and running[0][3] == {}
    await wait_history(comfy, prompt_id)
    assert list((await http.get(f"/history/{prompt_id}")).json()) == [prompt_id]


async def test_restart_forgets_everything_but_files_and_keeps_the_port(comfy, http):
    done = await submit(http, probe())
    await wait_history(comfy, done)
    comfy.step_seconds = 0.05
    running = await submit(http, template("minimax-h3-t2va-single-gpu", steps=50))
    queued = await submit(http, probe("queued"))
    await comfy.wait_for(lambda: comfy.current_step >= 1)
    port = comfy.port
    async with Socket(comfy.ws_url("x")) as ws:
        await comfy.restart()
        await ws.wait(lambda: ws.closed)
    assert comfy.port == port
    assert (await http.get("/history")).json() == {}
    assert (await http.get("/queue")).json() == {"queue_running": [], "queue_pending": []}
    assert (comfy.root / "output" / "probe_00001_.png").is_file()
    r = await http.post("/prompt", json={"prompt": probe("after")})
    assert r.json()["number"] == 0  # a new process counts from 0 again
    await wait_history(comfy, r.json()["prompt_id"])
    assert running not in comfy.history and queued not in comfy.history


async def test_pause_listening_keeps_the_prompt_running(comfy, http):
    comfy.step_seconds = 0.02
    prompt_id = await submit(http, template("minimax-h3-t2va-single-gpu", steps=10))
    await comfy.wait_for(lambda: comfy.current_step >= 1)
    await comfy.pause_listening()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=comfy.url) as fresh:
            await fresh.get("/queue")
    await comfy.wait_for(lambda: prompt_id in comfy.history)
    await comfy.resume_listening()
    assert (await history(http, prompt_id))["status"]["status_str"] == "success"


async def test_go_down_and_come_up(comfy, http):
    prompt_id = await submit(http, probe())
    await wait_history(comfy, prompt_id)
    await comfy.go_down()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=comfy.url) as fresh:
            await fresh.get("/queue")
    await comfy.come_up()
    assert (await http.get(f"/history/{prompt_id}")).json() == {}


async def test_a_replaced_socket_closing_unregisters_its_successor_as_comfyui_does(comfy, http):
    async with Socket(comfy.ws_url("q")) as a:
        async with Socket(comfy.ws_url("q")) as b:
            await a.conn.close()
            await a.wait(lambda: a.closed)
            await comfy.wait_for(lambda: "q" not in comfy.sockets)
            prompt_id = await submit(http, probe(), "q")
            await wait_history(comfy, prompt_id)
            await asyncio.sleep(0.05)
            assert not b.ended(prompt_id)


async def test_front_and_explicit_number_and_sensitive_extra_data(comfy, http):
    comfy.step_seconds = 0.02
    blocker = await submit(http, template("minimax-h3-t2va-single-gpu", steps=20))
    late = (await http.post("/prompt", json={"prompt": probe("late")})).json()
    first = (await http.post("/prompt", json={"prompt": probe("first"), "front": True})).json()
    explicit = (
        await http.post("/prompt", json={"prompt": probe("x"), "number": 0.5, "extra_data": {"api_key_comfy_org": "s"}})
    ).json()
    assert (late["number"], first["number"], explicit["number"]) == (1, -2, 0.5)
    pending = (await http.get("/queue")).json()["queue_pending"]
    assert [item[1] for item in sorted(pending)] == [first["prompt_id"], explicit["prompt_id"], late["prompt_id"]]
    assert all(item[3] == {} for item in pending)  # sensitive keys never show
    comfy.step_seconds = 0.0
    await wait_history(comfy, late["prompt_id"])
    order = [k for k in comfy.history]
    assert order == [blocker, first["prompt_id"], explicit["prompt_id"], late["prompt_id"]]


async def test_received_records_requests(comfy, http):
    await http.post("/queue", json={"clear": True})
    await http.post("/upload/image", files={"image": ("a.png", png_bytes(2, 2))})
    assert comfy.received[0] == ("POST", "/queue", {"clear": True})
    assert comfy.received[1][:2] == ("POST", "/upload/image") and comfy.uploads[0]["name"] == "a.png"


def test_running_in_a_thread_for_synchronous_tests(tmp_path):
    with FakeComfyUI(tmp_path).running_in_thread() as comfy, httpx.Client(base_url=comfy.url) as http:
        r = http.post("/prompt", json={"prompt": probe()})
        deadline = time.monotonic() + 10
        while r.json()["prompt_id"] not in http.get("/history").json():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        comfy.call(comfy.restart())
        assert http.get("/history").json() == {}
