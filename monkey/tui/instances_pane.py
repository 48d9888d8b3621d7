"""Providers, their instances, the cloud instances monkey created (with their estimated cost),
and the live attempts on them with CPU/memory sparklines."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from monkey.api import REDACTED, is_secret_name
from monkey.store.cost import dollars
from monkey.tui.format import duration, place, size, sparkline

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HISTORY = 40  # heartbeats kept per attempt for its sparklines


class InstancesPane(Vertical):
    """What runs where: one table of providers and instances, one of the cloud instances
    monkey created (as `monkey list providers --monkey-instances` shows them), one of live
    attempts."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.history: dict[tuple[str, int], tuple[float | None, deque[float], deque[float]]] = {}

    def compose(self) -> ComposeResult:
        yield Static("providers and instances", classes="pane-title")
        yield DataTable(id="instances-table", cursor_type="row")
        yield Static("instances monkey created (estimated cost so far)", classes="pane-title")
        yield DataTable(id="created-table", cursor_type="row")
        yield Static(
            "live attempts (CPU % of one core, resident memory; one mark per heartbeat)",
            classes="pane-title",
        )
        yield DataTable(id="attempts-table", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one("#instances-table", DataTable).add_columns(
            "PROVIDER", "TYPE", "INSTANCE", "HOST", "STATE", "JOBS", "CONFIG"
        )
        self.query_one("#created-table", DataTable).add_columns(
            "INSTANCE", "PROVIDER", "STATE", "SIZE", "SPOT", "ADDRESS", "JOBS", "AGE", "$/H", "COST"
        )
        self.query_one("#attempts-table", DataTable).add_columns(
            "JOB",
            "TRY",
            "NAME",
            "WHERE",
            "GPUS",
            "RUNTIME",
            "CPU",
            "CPU HISTORY",
            "MEM",
            "MEM HISTORY",
            "HEARTBEAT",
        )

    def show(
        self,
        providers: dict[str, tuple[str, dict[str, Any]]],
        instances: list[dict[str, Any]],
        live: list[dict[str, Any]],
        now: float,
        created: list[dict[str, Any]],
    ) -> None:
        """Redraw from the providers' configuration, recorded instances, live attempts and
        the instances monkey created (``Monkey.monkey_instances``)."""
        jobs_on: dict[str, int] = {}
        jobs_of: dict[str, int] = {}
        for att in live:
            jobs_on[att["instance"]] = jobs_on.get(att["instance"], 0) + 1
            jobs_of[att["provider"]] = jobs_of.get(att["provider"], 0) + 1
        rows: list[tuple[str, ...]] = []
        for name, (kind, options) in sorted(providers.items()):
            mine = [i for i in instances if i["provider"] == name]
            if "hosts" in options:  # not hosts since removed from providers.yml
                hosts = {
                    f"{name}/{h.get('name') or h.get('host')}"
                    for h in options["hosts"] or []
                    if isinstance(h, dict)
                }
                mine = [i for i in mine if i["id"] in hosts]
            config = (
                ", ".join(
                    f"{k}={REDACTED if is_secret_name(k) else _short(v)}"
                    for k, v in sorted(options.items())
                    if k != "hosts"
                )
                or "defaults"
            )
            if not mine:
                rows.append((name, kind, "-", "-", "configured", str(jobs_of.get(name, 0)), config))
            for inst in mine:
                error = (inst.get("extra") or {}).get("error")  # why a host is down, with the fix
                state = inst.get("reach") or inst["state"]
                rows.append(
                    (
                        name,
                        kind,
                        inst["id"],
                        inst["host"],
                        f"{state}: {error}" if error else state,
                        str(jobs_on.get(inst["id"], 0)),
                        config,
                    )
                )
        _replace(self.query_one("#instances-table", DataTable), rows)
        _replace(
            self.query_one("#created-table", DataTable),
            [
                (
                    i["id"],
                    i["provider"],
                    i["state"],
                    i["size"] or "-",
                    "spot" if i["spot"] else "-",
                    i["address"] or "-",
                    ",".join(i["jobs"]) or "-",
                    duration(i["age"]),
                    "-" if i["price"] is None else f"{i['price']:g}",
                    dollars(i["cost"]),
                )
                for i in created
            ],
        )

        seen = set()
        rows = []
        for att in live:
            key = (att["juid"], att["n"])
            seen.add(key)
            beat, cpus, mems = self.history.get(
                key, (None, deque(maxlen=HISTORY), deque(maxlen=HISTORY))
            )
            if att["heartbeat_at"] != beat and att["cpu"] is not None:
                cpus.append(float(att["cpu"]))
                mems.append(float(att["rss"] or 0))
            self.history[key] = (att["heartbeat_at"], cpus, mems)
            where = place(att["provider"], att["instance"])
            ran = now - att["started_at"] if att["started_at"] else None
            since = now - att["heartbeat_at"] if att["heartbeat_at"] else None
            rows.append(
                (
                    att["juid"],
                    str(att["n"]),
                    att["name"],
                    where,
                    att["gpus"] or "-",
                    duration(ran),
                    "-" if att["cpu"] is None else f"{att['cpu']:.0f}%",
                    sparkline(list(cpus)),
                    size(att["rss"]),
                    sparkline(list(mems)),
                    "-" if since is None else f"{duration(since)} ago",
                )
            )
        for key in set(self.history) - seen:
            del self.history[key]
        _replace(self.query_one("#attempts-table", DataTable), rows)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 30 else text[:27] + "..."


def _replace(table: DataTable, rows: list[tuple[str, ...]]) -> None:
    """Show ``rows``, keeping the cursor; a no-op when they did not change."""
    current = [tuple(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]
    if current == rows:
        return
    cursor = table.cursor_row
    table.clear()
    table.add_rows(rows)
    if rows:
        table.move_cursor(row=min(cursor, len(rows) - 1), animate=False)
