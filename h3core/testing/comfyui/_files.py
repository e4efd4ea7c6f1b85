"""The server's folders (root/input, output, temp): annotated names, POST /upload/image and GET /view.

Paths are checked as ComfyUI 0.3.64 checks them (server.py), so a client's mistakes get its answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import mimetypes
import os
import shutil
from pathlib import Path
from typing import Any

from aiohttp import web

KINDS = ("input", "output", "temp")
# What /view never serves as itself: a browser would run it.
_UNSAFE_TYPES = {"text/html", "text/html-sandboxed", "application/xhtml+xml", "text/javascript", "text/css"}


class Files:
    def __init__(self, root: Path) -> None:
        self.root = root

    def make(self) -> None:
        for kind in KINDS:
            (self.root / kind).mkdir(parents=True, exist_ok=True)

    def wipe_temp(self) -> None:
        """Empty temp/ (ComfyUI wipes its temp folder at start-up)."""
        folder = self.root / "temp"
        if folder.is_dir():
            for p in folder.iterdir():
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        p.unlink()
        else:
            folder.mkdir(parents=True, exist_ok=True)

    def dir(self, kind: str | None) -> Path | None:
        return self.root / kind if kind in KINDS else None

    def input_files(self, kinds: tuple[str, ...]) -> list[str]:
        """The files in input/ of these content types ("image", "video", "audio"): a file combo's options."""
        folder = self.root / "input"
        names = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        return [n for n in names if (mimetypes.guess_type(n)[0] or "").split("/")[0] in kinds]

    def annotated(self, name: str) -> tuple[str, Path]:
        """ "a.png [output]" -> ("a.png", root/output); no annotation means input/."""
        for kind in KINDS:
            if name.endswith(f" [{kind}]"):
                return name[: -len(kind) - 3], self.root / kind
        return name, self.root / "input"

    def exists_annotated(self, name: Any) -> bool:
        if not isinstance(name, str):
            return False
        name, base = self.annotated(name)
        return (base / name).exists()

    async def upload_image(self, request: web.Request, uploads: list[dict[str, Any]]) -> web.Response:
        """POST /upload/image; what it answers is also appended to `uploads`, with "path", "bytes", "duplicate"."""
        post = await request.post()
        image = post.get("image")
        overwrite = post.get("overwrite")
        upload_type = post.get("type") or "input"
        if upload_type not in KINDS:
            raise UnboundLocalError("cannot access local variable 'type_dir'")  # what ComfyUI trips over: a 500
        upload_dir = str(self.dir(str(upload_type)))
        if not (isinstance(image, web.FileField) and image.file):
            return web.Response(status=400)
        filename = image.filename
        if not filename:
            return web.Response(status=400)
        subfolder = str(post.get("subfolder", ""))
        full_folder = os.path.join(upload_dir, os.path.normpath(subfolder))
        filepath = os.path.abspath(os.path.join(full_folder, filename))
        if os.path.commonpath((upload_dir, filepath)) != upload_dir:
            return web.Response(status=400)
        os.makedirs(full_folder, exist_ok=True)
        data = image.file.read()
        base, ext = os.path.splitext(filename)
        duplicate = False
        if not (overwrite is not None and overwrite in ("true", "1")):
            i = 1
            while os.path.exists(filepath):
                with open(filepath, "rb") as f:
                    if hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest():
                        duplicate = True
                        break
                filename = f"{base} ({i}){ext}"
                filepath = os.path.join(full_folder, filename)
                i += 1
        if not duplicate:
            with open(filepath, "wb") as f:
                f.write(data)
        answer = {"name": filename, "subfolder": subfolder, "type": upload_type}
        uploads.append({**answer, "path": Path(filepath), "bytes": len(data), "duplicate": duplicate})
        return web.json_response(answer)

    async def view(self, request: web.Request) -> web.StreamResponse:
        """GET /view: the file unchanged (`preview=` and `channel=` are not applied; there is no Pillow here)."""
        q = request.rel_url.query
        if "filename" in q:
            filename, output_dir = q["filename"], None
            for kind in KINDS:
                if filename.endswith(f" [{kind}]"):
                    filename, output_dir = filename[: -len(kind) - 3], str(self.dir(kind))
            if not filename:
                return web.Response(status=400)
            if filename[0] == "/" or ".." in filename:
                return web.Response(status=400)
            if output_dir is None:
                d = self.dir(q.get("type", "output"))
                output_dir = str(d) if d is not None else None
            if output_dir is None:
                return web.Response(status=400)
            if "subfolder" in q:
                full = os.path.join(output_dir, q["subfolder"])
                if os.path.commonpath((os.path.abspath(full), output_dir)) != output_dir:
                    return web.Response(status=403)
                output_dir = full
            filename = os.path.basename(filename)
            file = os.path.join(output_dir, filename)
            if os.path.isfile(file):
                content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
                if content_type in _UNSAFE_TYPES:
                    content_type = "application/octet-stream"
                headers = {"Content-Disposition": f'filename="{filename}"', "Content-Type": content_type}
                return web.FileResponse(file, headers=headers)
        return web.Response(status=404)
