"""The HTTP service: a Litestar app (`h3core.service.app.create_app`) over the runner and its
stores, serving h3core's API at /v1/jobs, OpenAI's Videos API at /v1/videos, the operations' routes
and the operator console."""
