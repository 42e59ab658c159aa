"""The worker's logic, pure of I/O where it can be: fan-in, sequencing, shaping, checkpoints,
and the stages and loop that run them against a bus and a replay log."""
