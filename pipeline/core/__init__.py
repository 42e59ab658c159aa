"""The core types every part shares: the canonical events and their codec, the error tree,
ids, limits, redaction, retry, resource lifecycles and lazy loading tables."""
