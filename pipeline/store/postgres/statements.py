"""The PostgreSQL replay log's statements: the bulk append through ``COPY`` into a staging
table, the upsert of runs, the claim of a run."""

from __future__ import annotations

from typing import Any

from ...core.envelope import Event
from ..outbox import INSERT_NOTICE, in_dialect
from ..runmeta import upsert_run_sql

COPY_THRESHOLD = 256
NOTICE_INSERT = in_dialect(INSERT_NOTICE, "%s")

CLAIM = """
WITH logged AS (SELECT tenant, coalesce(root_id, run_id) AS root FROM runs WHERE run_id = %(run)s),
claimed AS (
    INSERT INTO run_owners (run_id, tenant, root_id)
    SELECT %(run)s, coalesce((SELECT tenant FROM logged), %(tenant)s),
           coalesce((SELECT root FROM logged), %(root)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING tenant, root_id
)
SELECT tenant, root_id FROM claimed
UNION ALL SELECT tenant, root_id FROM run_owners WHERE run_id = %(run)s
"""
"""Insert the claim unless one exists, and return the owner (the new row, or the one there)."""

STAGE = """
CREATE TEMP TABLE IF NOT EXISTS runwire_stage (
    id text, run_id text, tenant text, child_id text, seq bigint, type text, ts text, body bytea
) ON COMMIT DELETE ROWS
"""

STAGE_TYPES = ["text", "text", "text", "text", "int8", "text", "text", "bytea"]
"""Binary COPY: the envelope bytes go as they are (text COPY would hex-escape them)."""
COLUMNS = "id, run_id, tenant, child_id, seq, type, ts, payload, body"
FROM_STAGE = (
    f"INSERT INTO events ({COLUMNS}) SELECT id, run_id, tenant, child_id, seq, type,"
    " ts::timestamptz, convert_from(body, 'UTF8')::jsonb -> 'payload', body FROM {source}"
    " ON CONFLICT (run_id, seq) DO NOTHING RETURNING run_id, seq"
)
FROM_ARRAYS = FROM_STAGE.format(
    source="unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[],"
    " %s::text[], %s::bytea[]) AS u(id, run_id, tenant, child_id, seq, type, ts, body)"
)

UPSERT_RUN = upsert_run_sql("%s", "greatest")


def stage_row(event: Event, body: bytes) -> tuple[Any, ...]:
    return (event.id, event.run_id, event.tenant, event.child_id, event.seq, event.type,
            event.ts, body)
