"""Admission across runner nodes: a request is admitted if at least one node could run it.

Nodes sharing one store may differ (a longer clip window, a larger token budget, other modes);
each is judged by its own `AdmissionRules`, and a job then waits in the queue until a node that can run
it claims it. A request no node admits is refused with the refusal of the node that comes closest
(the largest ceiling for its shape), naming that node. Pure: a function of the nodes' contracts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from h3core.domain.admission import AdmissionRules, Admit, CeilingRow, Decision, Refuse
from h3core.domain.geometry import Media
from h3core.domain.request import GenerationRequest

__all__ = ["NodeRules", "ceilings_across", "decide_across"]

NodeRules = tuple[str, AdmissionRules]  # a node's id and what it can run


def decide_across(nodes: Sequence[NodeRules], request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
    """The first node's admission that admits (its tokens and frames), else the refusal of the
    node with the largest ceiling for the request's shape (the first of equals), naming it."""
    if not nodes:
        raise ValueError("admission across nodes needs at least one node")
    refusals: list[tuple[str, Refuse]] = []
    for node, contract in nodes:
        decision = contract.decide(request, media)
        if isinstance(decision, Admit):
            return decision
        refusals.append((node, decision))
    node, closest = max(refusals, key=lambda r: r[1].ceiling.max_frames if r[1].ceiling is not None else -1)
    where = f"node {node}" if len(nodes) == 1 else f"no node of {len(nodes)} runs it; the closest, node {node}"
    return closest.model_copy(update={"detail": f"{where}: {closest.detail}"})


def ceilings_across(nodes: Sequence[NodeRules]) -> list[CeilingRow]:
    """/v1/ceilings over several nodes: per shape the largest ceiling among them (the first of
    equals), its `why` naming the node; shapes are every node's offered resolutions, in order."""
    if not nodes:
        raise ValueError("ceilings across nodes need at least one node")
    if len(nodes) == 1:
        return nodes[0][1].ceilings()
    resolutions = list(dict.fromkeys(r for _, c in nodes for r in c.resolutions))
    tables = [(node, contract.ceilings(resolutions)) for node, contract in nodes]
    rows = []
    for i, _ in enumerate(tables[0][1]):
        node, row = max(((node, table[i]) for node, table in tables), key=lambda r: r[1].max_frames)
        rows.append(row.model_copy(update={"why": f"node {node}: {row.why}"}))
    return rows
