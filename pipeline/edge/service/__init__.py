"""The edge's service layer, the same for every entrance (HTTP, WebSocket, gRPC, Durable
Streams, chat, A2A): who asks (``auth``, ``authz``, ``quotas``), what they ask (``ingest``,
``control``, ``runs``, ``fork``, ``threads``, ``streams``), with the edge's shared state
(``context``: :class:`~runwire.edge.service.context.Edge`; ``busgate``: the bus's health) and
the bounds on every parameter (``params``).
"""
