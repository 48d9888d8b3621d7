"""The key bar at the bottom of the dashboard's screens: Textual's Footer, without its leak."""

from __future__ import annotations

from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's `Footer`, rebuilt on each screen push and each change of the legal actions.

    Every key it composes binds itself to the footer's `compact` reactive, and Textual prunes
    those watchers only when `compact` changes: each rebuild kept the previous keys alive
    (about 15 widgets with their caches), so the heap grew with every modal opened until the
    garbage collector's full passes took 100-300 ms and delayed the next modal by as much.
    Flipping `compact` there and back after a rebuild drops the watchers of removed keys.
    """

    async def recompose(self) -> None:
        await super().recompose()
        with self.app.batch_update():
            self.compact = not self.compact
            self.compact = not self.compact
