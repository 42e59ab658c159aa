"""runwire: the event pipeline between AI agents and the people watching them.

The library: the canonical envelope, protocol codecs, the bus, the replay
log, shaping and sequencing, the edge app and the publisher SDK.
"""

from __future__ import annotations

from .envelope import Event, decode, encode, make
from .errors import RunwireError
from .publisher import Publisher, Run

__all__ = ["Event", "Publisher", "Run", "RunwireError", "decode", "encode", "make"]
__version__ = "0.1.0"
