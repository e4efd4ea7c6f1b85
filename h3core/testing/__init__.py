"""For implementers and embedders: what h3core's own suite uses to test its pluggable parts.

- `h3core.testing.store`: `EventStoreContract`, the event-store contract as a pytest class to
  run against any store (needs pytest);
- `h3core.testing.artifacts`: `ArtifactStoreContract`, the artifact-store contract, likewise;
- `h3core.testing.nodes`: `NodeLeasesContract`, the node-lease contract (fenced writes, leases
  ending with their attempt, optimistic takeover, the store's clock) for any store shared by
  runner nodes, likewise;
- `h3core.testing.uploads`: `UploadStoreContract`, the upload-store contract, likewise (needs
  anyio's pytest plugin and Pillow; PyAV and numpy for its video and sound cases);
- `h3core.testing.webhooks`: `WebhookTransportContract`, the webhook-transport contract, likewise,
  with `LoopbackReceivers`, real receivers on loopback to run it against (needs anyio's plugin);
- `h3core.testing.executor`: `ExecutorContract`, the executor contract (progress, one result,
  cancellation, `check` against capabilities), for any executor (needs pytest and anyio);
- `h3core.testing.factories`: builders of valid requests, artifacts, job logs and PNGs;
- `h3core.testing.comfyui`: `FakeComfyUI`, a protocol-faithful fake ComfyUI server, with the
  protocol it reproduces in `comfyui_protocol/` (needs aiohttp).

`import h3core` does not import this package; each module imports what it needs itself.
"""
