"""Offline jobs over the replay log: replaying a run, chat messages, per-run statistics, the demo runs."""
