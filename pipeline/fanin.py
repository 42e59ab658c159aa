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
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec.structs import replace as replace_struct

from .envelope import ChildSpawn, Event

MAX_DEPTH = 64
"""A parent chain longer than this is cut (guards against a cycle in bad input)."""


class ParentMap:
    """Child run → parent run links, learned from events."""

    __slots__ = ("_parents",)

    def __init__(self) -> None:
        self._parents: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._parents)

    def parent_of(self, run_id: str) -> str | None:
        return self._parents.get(run_id)

    def link(self, child: str, parent: str) -> None:
        """Record that ``child`` is a sub-run of ``parent`` (self-links are ignored)."""
        if child != parent:
            self._parents[child] = parent

    def learn(self, event: Event) -> None:
        """Learn the parent links an event states."""
        if event.parent_id is not None:
            self.link(event.run_id, event.parent_id)
            if event.root_id is not None and event.root_id != event.parent_id:
                self._parents.setdefault(event.parent_id, event.root_id)
        if isinstance(event, ChildSpawn):
            self.link(event.payload.child_id, event.run_id)

    def learn_chain(self, run_id: str, ancestors: Iterable[str]) -> None:
        """Record a known ancestor chain (parent first, root last)."""
        child = run_id
        for ancestor in ancestors:
            self.link(child, ancestor)
            child = ancestor

    def root_of(self, run_id: str) -> str:
        """The furthest known ancestor of ``run_id`` (itself when it has no known parent)."""
        parents = self._parents
        if run_id not in parents:  # a root (every event of a correctly published tree)
            return run_id
        seen = {run_id}
        while len(seen) <= MAX_DEPTH:
            parent = parents.get(run_id)
            if parent is None or parent in seen:
                return run_id
            seen.add(parent)
            run_id = parent
        return run_id

    def forget(self, run_id: str) -> None:
        self._parents.pop(run_id, None)

    def ancestors(self, event: Event) -> list[str]:
        """Parent first, root last; empty unless the event carries its parent and root links."""
        if event.parent_id is None or event.root_id is None:
            return []
        chain = [event.parent_id]
        seen = {event.run_id, event.parent_id}
        while chain[-1] != event.root_id and len(chain) < MAX_DEPTH:  # never past the root
            parent = self._parents.get(chain[-1])
            if parent is None or parent in seen:
                break
            chain.append(parent)
            seen.add(parent)
        root = event.root_id
        if root is not None and root not in seen:
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
