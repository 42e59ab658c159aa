"""The Durable Streams entrance: ``read`` (``GET``: catch-up, long-poll, SSE) and ``write``
(``PUT``/``POST``/``DELETE``: create, append with idempotent producers, close, fork)."""
