"""Runnable processes: thin wiring of ``pipeline`` pieces into services."""
