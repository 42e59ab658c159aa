"""One module per ``runwire`` subcommand."""
