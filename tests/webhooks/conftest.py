"""The store fixtures of ``tests/store`` (every replay log on SQLite and on a real PostgreSQL), for
the delivery loop's tests that need both."""

from tests.store.conftest import new_store_url, store_url

__all__ = ["new_store_url", "store_url"]
