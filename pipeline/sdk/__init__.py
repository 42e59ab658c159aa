"""The publisher SDK agents embed: runs, events, delivery, and the run context that crosses services."""
