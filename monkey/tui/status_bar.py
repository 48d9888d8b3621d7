"""The line at the top: whether the core runs, job counts, filter, order, marks."""

from __future__ import annotations

from collections import Counter

from textual.widgets import Static

from monkey.tui.format import STATE_STYLES

_ORDER = (
    "running",
    "dispatching",
    "queued",
    "paused",
    "failed",
    "lost",
    "preempted",
    "cancelled",
    "succeeded",
)


class StatusBar(Static):
    """One line of `Static`, rebuilt from what the app knows (cheap: it is one line)."""

    _line = ""

    def show(
        self,
        *,
        core_pid: int | None,
        counts: Counter[str],
        shown: int,
        marked: int,
        filter_text: str,
        sort: str,
        grouped: bool,
        problems: int = 0,
        remote: str | None = None,
    ) -> None:
        """REMOTE: the main node shown (its core is run by its server, never started here)."""
        up, down = STATE_STYLES["succeeded"], STATE_STYLES["failed"]
        if core_pid:
            core = (
                f"[{up}]core running[/] (pid {core_pid})"
                if core_pid > 0
                else f"[{up}]core starting[/]"
            )
        elif remote:
            core = f"[{down}]core down[/] — the server of {remote} restarts it"
        else:
            core = f"[{down}]core down[/] — press [b]D[/] to start it"
        if remote:
            core = f"main node [b]{remote}[/]: {core}"
        total = sum(counts.values())
        parts = [f"{counts[s]} [{STATE_STYLES[s]}]{s}[/]" for s in _ORDER if counts[s]]
        line = f"{core} · {total} jobs" + (f": {', '.join(parts)}" if parts else "")
        if filter_text:
            line += f" · filter [b]{filter_text}[/] ({shown} shown)"
        if problems:
            line += f" · [{down}]{problems} problem{'s' if problems > 1 else ''}[/] ([b]![/] shows them first)"
        if marked:
            line += f" · [b]{marked} marked[/]"
        line += f" · sort {sort}" + (" · grouped by sweep" if grouped else "")
        if line != self._line:  # an idle poll changes nothing on screen
            self._line = line
            self.update(line)
