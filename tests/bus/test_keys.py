"""Key layout: what must share a Redis Cluster slot does, what must spread does."""

from __future__ import annotations

from redis.crc import key_slot

from runwire.bus import keys


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_one_runs_keys_share_a_slot() -> None:
    for run in ("run-1", "r{x}", "a}b{", "%7B"):
        run_keys = [keys.delivery_key("rw", run, "raw"), keys.delivery_key("rw", run, "shaped"),
                    keys.meta_key("rw", run, "raw"), keys.meta_key("rw", run, "shaped"),
                    keys.control_key("rw", run)]
        assert len({slot(k) for k in run_keys}) == 1, run


def test_escaping_never_maps_two_runs_to_one_key() -> None:
    runs = ["a{b", "a%7Bb", "a%257Bb", "a}b", "a%7Db"]
    assert len({keys.delivery_key("rw", r, "raw") for r in runs}) == len(runs)


def test_a_groups_coordination_keys_share_a_slot() -> None:
    group_keys = [keys.members_key("rw", "g{1}")] + [
        keys.lease_key("rw", "g{1}", s) for s in range(64)]
    assert len({slot(k) for k in group_keys}) == 1


def test_ingest_shards_spread_over_slots() -> None:
    slots = {slot(keys.ingest_key("rw", s)) for s in range(16)}
    assert len(slots) == 16
    assert len({s * 3 // 16384 for s in slots}) == 3  # every node of a 3-primary cluster


def test_shard_of_a_root_run_is_stable() -> None:
    assert keys.shard_for("run-1", 16) == keys.shard_for("run-1", 16)
    assert {keys.shard_for(f"run-{i}", 16) for i in range(200)} == set(range(16))
