"""The operator console at /console: the queue live, a job's life as a timeline, submitting within
the ceilings, the box. Server-rendered pages (Jinja2) and one hand-written script; no build step."""

from h3core.service.console.pages import CONSOLE_PATH, console_router

__all__ = ["CONSOLE_PATH", "console_router"]
