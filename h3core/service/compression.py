"""Responses gzip-compressed for clients that accept it (the console's pages and parts, the JSON of
/v1): text shrinks five to ten times. Routes whose bodies are media (already compressed, and served
by byte ranges a compressed body would break) or live streams opt out with `UNCOMPRESSED`."""

from __future__ import annotations

from litestar.config.compression import CompressionConfig

__all__ = ["UNCOMPRESSED", "compression"]

UNCOMPRESSED = "uncompressed"  # a route's opt key: never compress its responses


def compression() -> CompressionConfig:
    """The app's compression: gzip at level 6 (most of level 9's saving at a fraction of its CPU, for
    a page part sent every 250 ms), for bodies of 1 KiB and more."""
    return CompressionConfig(backend="gzip", minimum_size=1024, gzip_compress_level=6, exclude_opt_key=UNCOMPRESSED)
