"""The public HTTP API: wire schemas (``schemas``) apart from the handlers (``server``)."""
