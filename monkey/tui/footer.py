"""The key bar at the bottom of the dashboard's screens: Textual's Footer, rebuilt only when
its keys change and without leaking the old ones."""

from __future__ import annotations

from collections.abc import Hashable

from textual.dom import NoScreen
from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's `Footer`, which rebuilds its keys (a widget each) whenever the bindings may
    have changed: on every screen push and pop, and every change of the legal actions.

    - A rebuild that would show the same keys is skipped: opening and closing a modal
      leaves the footer as it was, so it no longer makes and drops 15 widgets each time
      (work on the key's path, and garbage for the collector's pauses).
    - Every key it composes binds itself to the footer's `compact` reactive, and Textual
      prunes those watchers only when `compact` changes: each rebuild kept the previous keys
      alive, the heap grew with every modal opened, and full collections took 100-300 ms.
      Flipping `compact` there and back after a rebuild drops the watchers of removed keys.
    """

    _shown: Hashable = None

    def _keys(self) -> Hashable:
        """What the footer would show: each active binding's key, text and state."""
        return tuple(
            (key, b.binding.description, b.binding.show, b.enabled, b.tooltip)
            for key, b in self.screen.active_bindings.items()
        )

    async def recompose(self) -> None:
        try:
            keys = self._keys()
        except NoScreen:  # its screen was popped while this rebuild waited its turn
            return
        if keys == self._shown and self.children:
            return
        self._shown = keys
        await super().recompose()
        with self.app.batch_update():
            self.compact = not self.compact
            self.compact = not self.compact
