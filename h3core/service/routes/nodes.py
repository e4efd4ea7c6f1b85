"""/v1/nodes: the runner nodes of a store shared by several, and draining one."""

from __future__ import annotations

from litestar import Request, get, patch
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.params import FromPath, JSONBody

from h3core.adapters.store.nodes import WithNodeLeases
from h3core.runtime.draining import NoSuchNode, set_draining
from h3core.service.auth import requester
from h3core.service.context import Service
from h3core.service.requests import NodePatch
from h3core.service.submission import in_thread
from h3core.service.views import NodeView, problems


@get(
    "/nodes",
    summary="The runner nodes",
    responses=problems(401),
    description="Every runner node of a store shared by several (PostgreSQL), live or not, by id, read from the "
    "store now; none on a store of one runner (SQLite).",
)
async def list_nodes(svc: NamedDependency[Service]) -> list[NodeView]:
    """The nodes as the store keeps them now."""
    store = svc.store
    rows = await in_thread(store.leases.nodes) if isinstance(store, WithNodeLeases) else []
    return [NodeView.of(n) for n in rows]


@patch(
    "/nodes/{node_id:str}",
    summary="Drain a runner node, or clear its drain",
    responses=problems(400, 401, 404, 415, 422),
    description="A draining node claims no new job; what it runs goes on to its end, and its /readyz answers 503. "
    "The mark keeps when it was first set and who set it, and lasts through the node's restarts until cleared. "
    "404 for a node the store does not know (a store of one runner has none).",
)
async def patch_node(
    svc: NamedDependency[Service], request: Request, node_id: FromPath[str], data: JSONBody[NodePatch]
) -> NodeView:
    """The node as the store keeps it after the change."""
    by = requester(request, svc.settings.api_tokens)
    try:
        row = await in_thread(set_draining, svc.store, node_id, data.draining, by)
    except NoSuchNode as exc:
        raise NotFoundException(str(exc)) from None
    return NodeView.of(row)


handlers = [list_nodes, patch_node]
