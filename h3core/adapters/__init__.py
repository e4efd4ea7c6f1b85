"""The adapters: h3core's I/O behind the domain's contracts (event and artifact stores, uploads,
webhook sending, the runner lock, capacity profiles on disk, video files). They build on
`h3core.domain`, never on the layers above it."""
