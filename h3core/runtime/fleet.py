"""Admission on a store shared by runner nodes: a request is judged against every live node.

Each runner node states in its heartbeat what its own admission judges a request by
(`NodeInfo.rules`: its executor's capabilities with the budgets its capacity profiles give each
group, and the profile that describes it: quality caps, the API's limit, canvases, the references
policy). `FleetAdmission` judges a submission against each live node's rules as that node states
them, and admits it if one node can run it (`h3core.domain.fleet`): a request no live node would
claim is refused, naming the limit, wherever it is submitted. A node of an older version states its
capabilities alone; this node's profiles are matched to them, as `LocalAdmission` matches its own.
This node's rules come fresh from its executor; the others' from the store, read by `watch` in a
worker thread every `interval_s`, so a submit never waits for the store. With no live node, the
last statements of the known nodes are used with no mode ready: the jobs are admitted and wait.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import anyio
from anyio.abc import TaskStatus

from h3core.adapters.store.nodes import NodeLeases, NodeRow
from h3core.domain.admission import DEFAULT_MAX_VIDEO_SECONDS, AdmissionRules, CeilingRow, Decision, RulesStatement
from h3core.domain.capabilities import Capabilities, ModeReadiness
from h3core.domain.capacity import CapacityProfile
from h3core.domain.fleet import NodeRules, ceilings_across, decide_across
from h3core.domain.geometry import Media
from h3core.domain.request import GenerationRequest
from h3core.runtime.admission import LocalAdmission, rules_for, unknown

__all__ = ["FleetAdmission"]

log = logging.getLogger("h3core.nodes")

# What a node's rules are built from: its statement of them, its capabilities (an older node's
# whole statement), and why none of its modes is ready (its last statement, the node not alive).
_Said = tuple[RulesStatement | None, Capabilities | None, str | None]


class FleetAdmission:
    """An `AdmissionPolicy` over every live runner node of a shared store (the module docstring).

    `local`: this process's own executor's contract, where it runs one (a runner node); None for an
    API node, which admits by what the runner nodes state."""

    def __init__(
        self,
        leases: NodeLeases,
        profiles: Sequence[CapacityProfile] = (),
        *,
        profile: CapacityProfile | None = None,
        local: LocalAdmission | None = None,
        interval_s: float = 1.0,
        max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS,
    ) -> None:
        """`max_video_seconds`: what nodes of an older version, which state no bound, are judged by."""
        self.leases = leases
        self.profiles = tuple(profiles)
        self.explicit = profile
        self.max_video_seconds = max_video_seconds
        self.local = local
        self.interval_s = interval_s
        self._others: tuple[NodeRules, ...] = ()  # live nodes but this one
        self._fallback: tuple[NodeRules, ...] = ()  # known nodes' last statements, none ready
        self._built: dict[str, tuple[_Said, AdmissionRules]] = {}  # each node's rules, until its statement changes

    # -- reading the nodes (a worker thread) ------------------------------------------------

    def refresh(self) -> None:
        """Read the nodes' statements from the store (blocking: call it from a worker thread)."""
        self.update(self.leases.nodes())

    def update(self, rows: Sequence[NodeRow]) -> None:
        """Judge by these node rows from now on: the live others' statements (each one's rules
        built again only when its statement changed), and the last known ones for when none is live."""
        me = self.leases.node_id
        stated = [r for r in rows if r.capabilities is not None and r.node_id != me]
        live = [r for r in stated if r.alive()]
        built: dict[str, tuple[_Said, AdmissionRules]] = {}

        def contract(row: NodeRow, not_ready: str | None = None) -> NodeRules:
            said = (row.rules, row.capabilities, not_ready)
            was = self._built.get(row.node_id)
            built[row.node_id] = was if was is not None and was[0] == said else (said, self._rules_of(row, not_ready))
            return row.node_id, built[row.node_id][1]

        others = tuple(contract(r) for r in live)
        fallback = tuple(
            contract(r, f"node {r.node_id} is not alive")
            for r in sorted(stated, key=lambda r: r.beat_at, reverse=True)  # the latest statement first
        )
        self._others, self._fallback, self._built = others, fallback, built

    def _rules_of(self, row: NodeRow, not_ready: str | None) -> AdmissionRules:
        """The node's rules as it states them, its profile included (`not_ready`: every mode not
        ready, for that reason); a node of an older version stated its capabilities alone: this
        node's profiles are matched to them."""
        if row.rules is not None:
            said = row.rules
            if not_ready is not None:
                said = said.model_copy(update={"capabilities": said.capabilities.not_ready(not_ready)})
            return AdmissionRules.of(said)
        assert row.capabilities is not None
        caps = row.capabilities if not_ready is None else row.capabilities.not_ready(not_ready)
        return rules_for(caps, self.profiles, self.explicit, max_video_seconds=self.max_video_seconds)

    async def watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the other nodes' statements fresh, until cancelled (read once before it starts).
        A read that fails keeps what was read before: the store's own watchers report it away."""
        await self.read()
        task_status.started()
        while True:
            await anyio.sleep(self.interval_s)
            await self.read()

    async def read(self) -> None:
        """`refresh` in a worker thread; a failure is logged and the last statements kept. A stop does
        not wait for it (a read of a store that is away waits for a connection)."""
        try:
            await anyio.to_thread.run_sync(self.refresh, abandon_on_cancel=True)
        except Exception as exc:
            log.warning("could not read the nodes' capabilities: %s", exc, extra={"error": str(exc)})

    # -- judging ----------------------------------------------------------------------------

    def nodes(self) -> list[NodeRules]:
        """The nodes a request is judged against: this one first, then the live others; with none
        live, the known ones' last statements (not ready), else the statement of nothing known."""
        mine = [(self.leases.node_id or "local", self.local.current())] if self.local is not None else []
        live = [*mine, *self._others]
        if live:
            return live
        return list(self._fallback) or [
            ("none", rules_for(unknown(), self.profiles, self.explicit, max_video_seconds=self.max_video_seconds))
        ]

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        """Admit the request if any node can run it (queued for that node); else the refusal of the
        node that comes closest."""
        return decide_across(self.nodes(), request, media)

    def current(self) -> AdmissionRules:
        """The contract /v1/ceilings describes the deployment by: this node's, else the first node's."""
        return self.nodes()[0][1]

    def ceilings(self) -> list[CeilingRow]:
        """Per shape the largest ceiling among the nodes, naming the node."""
        return ceilings_across(self.nodes())

    def source(self) -> Capabilities:
        """What the jobs' waiting reasons and /readyz read: this node's executor's statement; on an
        API node, the first node's, each mode ready where any node can start it now."""
        if self.local is not None:
            return self.local.source()
        nodes = self.nodes()
        runnable: dict[str, ModeReadiness] = {}
        for _, contract in nodes:
            for mode in contract.caps.modes:
                if mode.runnable:
                    runnable.setdefault(mode.mode, mode)
        return nodes[0][1].caps.with_modes(runnable.values())
