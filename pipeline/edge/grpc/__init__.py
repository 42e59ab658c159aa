"""The gRPC entrance (``runwire.v1``): ``server`` (the service), ``ingest`` (a publish stream),
``messages`` (frames ⇄ protobuf messages); served from the same
:class:`~runwire.edge.service.context.Edge` as HTTP."""
