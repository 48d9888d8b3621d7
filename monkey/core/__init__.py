"""The core: the daemon's scheduler loop, placement, dispatch, recovery."""
