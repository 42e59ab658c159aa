"""The chat entrance: ``serve`` (``WS /v1/threads``, the AI SDK's ``WebSocketChatTransport``
protocol: each chat turn sent to an agent through the requests channel, its run streamed back)."""
