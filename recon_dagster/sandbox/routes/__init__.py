"""One module per provider, each with its ``ROUTES`` table; ``media`` serves task outputs."""
