"""The HTTP entrance: ``app`` (the Starlette app: streams, ingest, control, runs, operations and
the page, with the other HTTP wings — Durable Streams, chat, A2A — mounted on it), ``fork``,
``threads``, ``runlog`` (export, spans), ``webhooks`` (the webhooks API), ``server`` (uvicorn)."""
