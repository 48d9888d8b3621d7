"""The worker agent (stdlib only, self-contained); the protocol is documented in ``agent``."""
