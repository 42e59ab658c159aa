"""Expiry lag: how long Redis keeps delivery streams past their TTL when many other keys have one.

A finished run's delivery streams leave Redis by TTL (``grace``), and Redis
reclaims an expired key either when something touches it or by its active
expiry cycle, which samples keys that have a TTL (about 20 every 100 ms)
and works harder only while more than 10 % of a sample has expired. Keys
that keep a long TTL — the writer checkpoints (meta hashes, ``ttl`` after a
run's end) — therefore slow the reclaiming of every expired stream. This
bench measures it: on a fresh ``redis-server`` of its own, for each count
of ``--long`` keys (300-byte hashes with a one-day TTL, as the checkpoints),
it writes ``--streams`` streams of ``--stream-bytes`` with a 1 s TTL and
prints how many are still held (and ``used_memory``) after each second,
until 98 % are gone or ``--wait`` seconds passed. Nothing reads the keys,
as nothing reads a finished run's streams once its clients left.

    .venv/bin/python bench/expiry.py --long 0,20000,200000

Not a test: it reports figures (docs/benchmarks.md § Expiry lag).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
import time

from redis import Redis
from redis.exceptions import RedisError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def started(port: int, extra: list[str], work: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly",
                             "no", "--dir", work, *extra], stdout=subprocess.DEVNULL)


def wait_up(redis: Redis) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.ping()
            return
        except RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def held(redis: Redis, long_keys: int) -> int:
    keyspace = redis.info("keyspace")
    return int(keyspace.get("db0", {"keys": long_keys})["keys"]) - long_keys


def one(args: argparse.Namespace, long_keys: int) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="runwire-expiry-") as work:
        server = started(port, args.redis_arg, work)
        redis = Redis(port=port)
        try:
            wait_up(redis)
            pipe = redis.pipeline(transaction=False)
            for i in range(long_keys):
                pipe.hset(f"meta:{i}", mapping={"last": i, "state": "x" * 300})
                pipe.expire(f"meta:{i}", 86_400)
                if i % 10_000 == 9_999:
                    pipe.execute()
            pipe.execute()
            blob = "y" * args.stream_bytes
            for i in range(args.streams):
                pipe.xadd(f"stream:{i}", {"e": blob})
                pipe.pexpire(f"stream:{i}", 1000)
            pipe.execute()
            began = time.monotonic()
            before = int(redis.info("memory")["used_memory"])
            left, elapsed = args.streams, 0.0
            while left > args.streams * 0.02 and elapsed < args.wait:
                time.sleep(1)
                elapsed = time.monotonic() - began
                left = held(redis, long_keys)
            after = int(redis.info("memory")["used_memory"])
        finally:
            redis.close()
            server.terminate()
            server.wait(timeout=10)
    return {"long_keys": long_keys, "streams": args.streams, "held_after_s": round(elapsed),
            "streams_held": left, "used_memory_mb_before": before / 1e6,
            "used_memory_mb_after": after / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--long", default="0,20000,200000",
                        help="counts of long-TTL keys to try, comma-separated")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--stream-bytes", type=int, default=8000)
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait at most")
    parser.add_argument("--redis-arg", action="append", default=[],
                        help="extra redis-server argument (repeat), e.g. --redis-arg=--hz=100")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.redis_arg = [part for arg in args.redis_arg for part in arg.split("=", 1)]
    for count in (int(n) for n in args.long.split(",")):
        result = one(args, count)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"{count:>9} keys with a day's TTL: {result['streams_held']} of "
                  f"{args.streams} streams with 1 s TTL still held after "
                  f"{result['held_after_s']:.0f} s; used_memory "
                  f"{result['used_memory_mb_before']:.1f} → {result['used_memory_mb_after']:.1f} MB",
                  flush=True)


if __name__ == "__main__":
    main()
