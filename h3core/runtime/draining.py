"""Draining a runner node: it takes no new jobs, and what it runs goes on to its end.

An operator drains a node before stopping it for a deploy or for maintenance (the console's box
page, `PATCH /v1/nodes/{id}`, `h3core nodes --drain`), and clears the drain to give it work again.
The mark is the store's (`NodeLeases.set_draining`), so any process of the deployment may set it,
and it outlives the node's restarts until cleared, as a cordon does. The node reads it at each beat
and before its first claim (h3core.runtime._nodes); /readyz on that node then answers 503, so a
load balancer sends its work elsewhere. Admission goes on counting a drained node: a drain is a
pause, and the jobs only it can run wait queued for it rather than being refused.
"""

from __future__ import annotations

import logging

from h3core.adapters.store.nodes import NodeRow, WithNodeLeases

__all__ = ["NoSuchNode", "set_draining"]

log = logging.getLogger("h3core.nodes")


class NoSuchNode(LookupError):
    """The store knows no runner node by that id (a store of one runner, SQLite's, has none)."""


def set_draining(store: object, node_id: str, draining: bool, by: str | None = None) -> NodeRow:
    """Mark `node_id` draining (an earlier mark kept) or clear it, logged with who asked (`by`, a
    token's name); the node as the store keeps it now. Blocking: call it from a worker thread."""
    if not isinstance(store, WithNodeLeases):
        raise NoSuchNode(f"no runner node {node_id!r}: this store has one runner and no nodes (stop it with SIGTERM)")
    if not store.leases.set_draining(node_id, draining, by):
        raise NoSuchNode(f"no runner node {node_id!r}")
    who = f" by {by}" if by else ""
    if draining:
        log.info("node %s marked draining%s: it takes no new jobs", node_id, who, extra={"node": node_id, "by": by})
    else:
        log.info("node %s: its drain cleared%s", node_id, who, extra={"node": node_id, "by": by})
    return next(n for n in store.leases.nodes() if n.node_id == node_id)
