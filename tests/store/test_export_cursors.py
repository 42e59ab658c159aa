"""The span exporter's cursors in the replay log, on SQLite and PostgreSQL: one holder at a time
per root run, a cursor that only its holder moves and only from where it stood, and the runs
that are behind it."""

from __future__ import annotations

from datetime import timedelta

from runwire.store import open_store
from tests.events import deltas, event
from tests.store.conftest import Clock


async def test_one_holder_at_a_time_and_a_cursor_moves_only_from_where_it_stood(
    store_url: str, clock: Clock
) -> None:
    async with open_store(store_url, clock=clock) as log:
        assert await log.export_claim(["a", "b"], "w1", 10) == {"a": 0, "b": 0}
        assert await log.export_claim(["a"], "w2", 10) == {}  # held by w1
        assert await log.export_commit([("a", 0, 5), ("b", 3, 9)], "w1", 10) == ["a"]  # b never stood at 3
        assert await log.export_commit([("a", 5, 7)], "w2", 10) == []  # w2 holds nothing
        assert await log.export_claim(["a"], "w1", 10) == {"a": 5}  # the holder again: renewed
        clock.advance(seconds=11)
        assert await log.export_claim(["a"], "w2", 10) == {"a": 5}  # w1's hold lapsed
        assert await log.export_commit([("a", 5, 8)], "w1", 10) == []  # w1 lost it
        assert await log.export_commit([("a", 5, 8)], "w2", 10) == ["a"]
        assert await log.export_claim(["a"], "w2", 10) == {"a": 8}


async def test_root_runs_past_their_cursor_are_behind_and_swept_runs_take_their_cursor_along(
    store_url: str, clock: Clock
) -> None:
    async with open_store(store_url, clock=clock) as log:
        await log.append(deltas("root", 1, 4))
        await log.append([event("kid", 1, parent_id="root", root_id="root")])
        await log.append(deltas("old", 1, 2))
        since, until = clock() - timedelta(minutes=1), clock() + timedelta(minutes=1)
        assert sorted(await log.export_behind(since, until, 10)) == ["old", "root"]
        await log.export_claim(["root"], "w1", 10)
        await log.export_commit([("root", 0, 4)], "w1", 10)
        assert await log.export_behind(since, until, 10) == ["old"]
        await log.append([event("root", 5, "run.lifecycle", {"state": "done"})])
        assert sorted(await log.export_behind(since, until, 10)) == ["old", "root"]
        assert await log.export_behind(until, until + timedelta(minutes=1), 10) == []
        clock.advance(days=400)
        await log.sweep()
        assert await log.export_claim(["root"], "w2", 10) == {"root": 0}  # its cursor went with it


async def test_a_log_beside_the_writer_shares_its_cursors_and_leaves_the_wal_checkpoints_to_it(
    store_url: str, clock: Clock
) -> None:
    """The span exporter's own connection (``beside``): the same runs and cursors, the writer's
    clock; on SQLite its commits never checkpoint the WAL (the writer's commits fill it)."""
    async with open_store(store_url, clock=clock) as log:
        side = log.beside()
        assert side is not None
        async with side:
            await log.append(deltas("root", 1, 4))
            assert await side.export_claim(["root"], "w1", 10) == {"root": 0}
            assert await side.export_commit([("root", 0, 4)], "w1", 10) == ["root"]
            assert await log.export_claim(["root"], "w1", 10) == {"root": 4}
            clock.advance(seconds=11)  # the side's holds run on the writer's clock
            assert await side.export_claim(["root"], "w2", 10) == {"root": 4}
            if store_url.startswith("sqlite"):
                def pages(store: object) -> int:
                    return int(store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])  # type: ignore[attr-defined]

                assert (await log._call(pages, log), await side._call(pages, side)) == (1000, 0)  # type: ignore[attr-defined]
    async with open_store("sqlite:///:memory:") as memory:
        assert memory.beside() is None  # one process's memory: nothing beside it
