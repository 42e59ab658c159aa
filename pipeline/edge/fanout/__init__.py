"""Fan-out: one run's events to many clients, whatever their entrance.

``hub`` (a run's feeds, shared by its clients), ``feed`` (one delivery stream read once for
every client of it), ``clients`` (a client's bounded queue), ``frames`` (the encoded frames a
client is sent), ``filters`` (profiles and children), ``session`` (one client's stream: replay,
then live, resumable), ``resume`` (where a resume starts: the hot stream or the replay log),
``transports`` (a session written as SSE, WebSocket or NDJSON).
"""
