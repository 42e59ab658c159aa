"""Smoke tests: each service fixture gives a real server, not a stand-in."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis


async def test_redis_is_a_real_server(redis_url: str) -> None:
    client = aioredis.from_url(redis_url)
    try:
        info = await client.info("server")
        assert int(str(info["redis_version"]).split(".")[0]) >= 6
        key = f"smoke:{uuid.uuid4().hex}"
        entry = await client.xadd(key, {"k": "v"})
        assert (await client.xrange(key))[0][0] == entry
        await client.delete(key)
    finally:
        await client.aclose()


async def test_redis_cluster_has_three_masters(redis_cluster_url: str) -> None:
    from redis.asyncio.cluster import RedisCluster

    host, port = redis_cluster_url.split("://", 1)[1].split(":")
    client = RedisCluster(host=host, port=int(port))
    try:
        await client.initialize()
        assert len(client.get_primaries()) == 3
        await client.set("{smoke}a", "1")
        assert await client.get("{smoke}a") == b"1"
    finally:
        await client.aclose()


async def test_kafka_broker_round_trips_a_message(kafka_url: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    bootstrap = kafka_url.split("://", 1)[1]
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"hello", key=b"run-1")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"g-{topic}", session_timeout_ms=2000,
                                heartbeat_interval_ms=500)  # (Tansu answers a join after half the session)
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=10_000)
        values = [m.value for msgs in batch.values() for m in msgs]
        assert values == [b"hello"]
    finally:
        await consumer.stop()


async def test_postgres_answers_a_query(postgres_url: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cur = await conn.execute("select version(), 6 * 7")
        version, answer = await cur.fetchone()  # type: ignore[misc]
        assert "PostgreSQL" in version
        assert answer == 42
