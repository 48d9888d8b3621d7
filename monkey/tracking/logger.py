"""Moved to ``monkey.client_agent.track`` (shipped to workers with the agent): this name is
that same module, so older imports share its buffer and settings."""

import sys

from monkey.client_agent import track

sys.modules[__name__] = track
