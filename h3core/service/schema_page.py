"""/schema: Swagger UI over the service's OpenAPI document, its script, style and icon served by the
service itself (the copy of Swagger UI that the swagger-ui-py package ships), so that the page works
on a GPU box with no way out to a CDN; the page names no other origin."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from litestar import get
from litestar.exceptions import NotFoundException
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.params import FromPath
from litestar.response import File

SCHEMA_PATH = "/schema"
ASSETS_PATH = f"{SCHEMA_PATH}/assets"
# The files the page loads, and their media types; nothing else of the package is served.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}


def _assets_dir() -> Path | None:
    # Located, not imported: the package's __init__ loads its glue for other web frameworks.
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def render_plugin() -> SwaggerRenderPlugin:
    """The page at /schema, loading Swagger UI from `ASSETS_PATH`."""
    return SwaggerRenderPlugin(
        path="/",
        js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        css_url=f"{ASSETS_PATH}/swagger-ui.css",
        standalone_preset_js_url=f"{ASSETS_PATH}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{ASSETS_PATH}/favicon-32x32.png'>",
    )


@get(f"{ASSETS_PATH}/{{name:str}}", include_in_schema=False, sync_to_thread=False)
def asset(name: FromPath[str]) -> File:
    """One of `ASSETS`, from the installed swagger-ui-py."""
    folder = _assets_dir()
    if name not in ASSETS or folder is None or not (folder / name).is_file():
        missing = "" if folder is not None else " (swagger-ui-py is not installed: pip install 'h3core[service]')"
        raise NotFoundException(f"no asset {name!r}{missing}")
    return File(path=folder / name, media_type=ASSETS[name], content_disposition_type="inline", filename=name)
