"""Fan-in: which delivery streams an event goes to.

An event of run ``C`` always goes to ``C``'s own stream. When ``C`` is a child
run (its events carry ``parent_id``, and ``root_id`` for deeper trees) it also
goes to its parent's stream and recursively up to the root's, with ``run_id``
set to that ancestor and ``child_id`` to the originating run ``C`` (Koder agent stream
§3.6: "events from the child stream appear in the parent stream with child_id
set"). Each child keeps its own stream, so a client can follow it alone or see
it only as a link (the loom-mcp stream package's ``child_run_linked``).

Parent links are learned from events (``parent_id``/``root_id``) and from the
parent's ``child.spawn``. An event fans in only when it carries its own parent
link *and* its root (``parent_id`` and ``root_id``, as the publisher SDK sets
them on every event of a child): ingest is partitioned by ``root_id or
run_id``, so only such events reach the root's single writer — fanning in
anything else would give a parent stream two writers. A child event that arrives before
the parent's ``child.spawn``, or whose parent is unknown, is therefore neither
lost (it is in its own stream) nor misattributed (it is never guessed into
some parent's stream).

**Links never cross tenants** (docs/security.md, "References inside events").
Every link remembers the tenant of the event that stated it, and a chain is
followed for an event only along links its own tenant stated: a
``child.spawn`` that names another tenant's run, or an event whose
``parent_id`` names one, links nothing that the other tenant's events
follow, so no event is fanned into a tree of another tenant and no tree is
rerouted under another tenant's root. A link stated by the run's own events
(its ``parent_id``) replaces one stated by a spawn of another tenant: the run's
own writer decides whose child it is.
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec.structs import replace as replace_struct

from ..core.envelope import ChildSpawn, Event

MAX_DEPTH = 64
"""A parent chain longer than this is cut (guards against a cycle in bad input)."""


ANY_TENANT = "\x00any"
"""The tenant of a link restored from a checkpoint written before links carried one (followed by all)."""


class ParentMap:
    """Child run → parent run links, learned from events, each with the tenant that stated it."""

    __slots__ = ("_parents", "_spawned", "_tenants", "version")

    def __init__(self) -> None:
        self.version = 0
        """Changes with every link made or forgotten: a chain computed at one version holds
        while it stays (see ``Processor._one``'s cached routes)."""
        self._parents: dict[str, str] = {}
        self._tenants: dict[str, str | None] = {}
        self._spawned: set[str] = set()
        """Children whose link only a ``child.spawn`` states (their own events may replace it)."""

    def __len__(self) -> int:
        return len(self._parents)

    def parent_of(self, run_id: str) -> str | None:
        return self._parents.get(run_id)

    def link(self, child: str, parent: str, tenant: str | None = ANY_TENANT, *, own: bool = True) -> None:
        """Record that ``child`` is a sub-run of ``parent``, as stated by ``tenant`` (self-links ignored).

        ``own``: the child's own events state it (else a spawn does). A link of
        another tenant is replaced only by the child's own events replacing a spawn's.
        """
        if child == parent:
            return
        if child in self._parents and self._tenants.get(child) != tenant:
            if not (own and child in self._spawned):
                return
        self.version += 1
        self._parents[child] = parent
        self._tenants[child] = tenant
        if own:
            self._spawned.discard(child)
        else:
            self._spawned.add(child)

    def _follows(self, child: str, tenant: str | None) -> bool:
        stated = self._tenants.get(child, ANY_TENANT)
        return stated == tenant or stated == ANY_TENANT

    def learn(self, event: Event) -> None:
        """Learn the parent links an event states (each tagged with the event's tenant).

        Every event of a child run states the same link: when it is known
        already (as this tenant's, not only a spawn's) nothing is relearned.
        """
        tenant = event.tenant
        parent = event.parent_id
        if parent is not None:
            run_id, parents = event.run_id, self._parents
            if parents.get(run_id) != parent or self._tenants[run_id] != tenant or run_id in self._spawned:
                self.link(run_id, parent, tenant)
            root = event.root_id
            if root is not None and root != parent and parent not in parents:
                self.link(parent, root, tenant)
        if type(event) is ChildSpawn:
            self.link(event.payload.child_id, event.run_id, tenant, own=False)

    def learn_chain(self, run_id: str, ancestors: Iterable[str], tenant: str | None = ANY_TENANT) -> None:
        """Record a known ancestor chain (parent first, root last) of a run of ``tenant``."""
        child = run_id
        for ancestor in ancestors:
            self.link(child, ancestor, tenant)
            child = ancestor

    def root_of(self, run_id: str, tenant: str | None = ANY_TENANT) -> str:
        """The furthest ancestor of ``run_id`` linked by ``tenant`` (itself when it has none)."""
        parents = self._parents
        if run_id not in parents:  # a root (every event of a correctly published tree)
            return run_id
        seen = {run_id}
        while len(seen) <= MAX_DEPTH:
            parent = parents.get(run_id)
            if parent is None or parent in seen or not self._follows(run_id, tenant):
                return run_id
            seen.add(parent)
            run_id = parent
        return run_id

    def forget(self, run_id: str) -> None:
        self.version += 1
        self._parents.pop(run_id, None)
        self._tenants.pop(run_id, None)
        self._spawned.discard(run_id)

    def ancestors(self, event: Event) -> list[str]:
        """Parent first, root last; empty unless the event carries its parent and root links.

        Only links stated by the event's own tenant are followed.
        """
        parent, root = event.parent_id, event.root_id
        if parent is None or root is None or parent == event.run_id:  # no run is its own parent
            return []
        if parent == root:  # a child of the root (most children): no chain to follow
            return [parent]
        tenant = event.tenant
        chain = [parent]
        seen = {event.run_id, parent}
        while chain[-1] != root and len(chain) < MAX_DEPTH:  # never past the root
            above = self._parents.get(chain[-1])
            if above is None or above in seen or not self._follows(chain[-1], tenant):
                break
            chain.append(above)
            seen.add(above)
        if root not in seen:
            chain.append(root)
        return chain


class Misrooted(Exception):
    """An event claims a root that is itself a child run (known from that run's checkpoint).

    Fanning it in here would split the tree: the claimed root's stream would get a
    second writer and the true root's stream would never see the event. The
    runtime re-publishes :attr:`rerouted` (the true root set) onto the ingest
    shard of the true root, whose single writer fans it in everywhere.
    """

    def __init__(self, event: Event, root: str) -> None:
        super().__init__(f"{event.type} of run {event.run_id} claims root {event.root_id}, "
                         f"a child of the tree rooted at {root}")
        self.event = event
        self.claimed = event.root_id or event.run_id
        self.rerouted = replace_struct(event, root_id=root)
