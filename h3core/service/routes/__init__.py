"""The service's routes, a module for each part of the API: /v1/jobs, /v1/uploads, /v1/videos
(OpenAI's), and the operations' (liveness, readiness, metrics, ceilings)."""
