"""A protocol-faithful fake ComfyUI server (aiohttp, like ComfyUI itself), for tests of a ComfyUI client.

Needs aiohttp (the `test` extra), and numpy and PyAV for `SaveVideo` (the `service` extra);
`import h3core` imports none of them.

It reproduces what `h3core/testing/comfyui_protocol/PROTOCOL.md` records of ComfyUI 0.3.64: the same
routes (also under `/api`), the same JSON shapes and status codes, prompt validation against a node
registry (`object_info_*.json`), one worker that runs prompts one at a time in `number` order, the
websocket message sequences (who gets what, in which order), node output caching across prompts,
interrupts, the queue, history, uploads and `/view`. Nodes do no real work: they sleep, count
progress and pass opaque values along; output nodes write real files (PNG, and a real H.264/AAC mp4
for `SaveVideo`). Faults are switched on with plain attributes, at any time, also mid-prompt.

    async with FakeComfyUI(tmp_path) as comfy:           # listens on 127.0.0.1, a free port
        comfy.step_seconds = 0.02
        comfy.oom_at_step = 3                            # the sampler fails at its third step
        ... a client talks to comfy.url ...
        assert comfy.history[prompt_id]["status"]["status_str"] == "error"
        await comfy.restart()                            # same port, history and queue forgotten

From synchronous code: `with FakeComfyUI(root).running_in_thread() as comfy: comfy.call(comfy.restart())`.

Where it knowingly differs from the real server (see also the test module):
- node outputs are tokens, not tensors; images are written small (at most 256 px a side, previews
  at most 64 px) and videos at `video_size` (64x64), whatever size the graph asks for;
- `current_inputs` of an error leave out hidden inputs (`prompt`, `extra_pnginfo`), and tracebacks
  are canned look-alikes of ComfyUI's frames;
- `/view?preview=...` and `channel=rgb|a` serve the file unchanged (no Pillow here);
- `%date%`-style variables in `filename_prefix` are not expanded;
- the node registry is the 37 classes of `object_info_stock.json` and `object_info_extra.json`, not 478;
- model-name combos (`unet_name`, `clip_name`, `vae_name`, `ckpt_name`) accept any value unless
  `model_files` is set (a real server lists the files in its models folders);
- when the fake itself drops sockets (`drop_sockets_at_step`, `pause_listening`, restarts), the
  dropped socket's handler does not unregister a newer socket of the same clientId; a socket the
  *client* closes after being replaced does (ComfyUI's `sockets.pop(sid)` quirk, reproduced).

Inside (all private; the names below are the public ones):
- `_server`: `FakeComfyUI`, the process and its lifetime, composed of the parts below;
- `_switches`: the fault switches and knobs;
- `_http`: the routes and what they answer; `_sockets`: websocket sessions and the message outbox;
- `_queue`: the prompt queue and history; `_validation`: prompt validation;
- `_worker`: runs prompts (execution order, messages, errors, interrupts); `_cache`: node outputs
  across prompts; `_progress`: progress messages and previews;
- `_registry` (with `object_info_stock.json`, `object_info_extra.json`): the node classes' specs;
  `_nodes`: what each class does; `_values`: the tokens that flow between nodes;
- `_failures`: node failures and canned tracebacks; `_media`: the files output nodes write;
  `_files`: the input/output/temp folders, uploads and /view; `_log`: comfyui.log; `_system`: the
  recorded server's features, folders and machine.
"""

from __future__ import annotations

from pathlib import Path

from ._media import png_bytes
from ._registry import NODE_INFO, STOCK_NODES
from ._server import FakeComfyUI

# What the fake reproduces: PROTOCOL.md and the recorded samples/ of a real ComfyUI 0.3.64.
PROTOCOL = Path(__file__).parent.parent / "comfyui_protocol"

__all__ = ["NODE_INFO", "PROTOCOL", "STOCK_NODES", "FakeComfyUI", "png_bytes"]
