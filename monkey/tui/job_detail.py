"""Everything recorded about one job: parameters, command, snapshot, git, attempts, events."""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from monkey.tui.format import STATE_STYLES, duration, when

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class JobDetail(VerticalScroll):
    """Shows `Monkey.info(job)`; redrawn only when what it shows changed."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._shown: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static("loading…", id="detail-body")

    def show(self, info: dict[str, Any], now: float) -> None:
        live = any(a["state"] == "live" for a in info["attempts_detail"])
        key = (json.dumps(info, sort_keys=True, default=str), int(now) if live else 0)
        if key == self._shown:
            return
        self._shown = key
        self.query_one("#detail-body", Static).update(_render(info, now))


def _render(info: dict[str, Any], now: float) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column(overflow="fold")
    state = Text(info["state"], style=STATE_STYLES.get(info["state"], ""))
    if info["reason"]:
        state.append(f" ({info['reason']})")
    if info["request"]:
        state.append(f" [{info['request']} requested]", style="italic")
    res = info["resources"]
    git = info["git"] or {}
    rows: list[tuple[str, Any]] = [
        ("job", f"{info['job']}  {info['name']}"),
        ("state", state),
        ("command", info["command"]),
        ("provider", info["provider"] + (f" on {info['instance']}" if info["instance"] else "")),
        (
            "resources",
            f"cpus {res['cpus']}, gpus {res['gpus']}"
            + (f", memory {res['memory']}" if res.get("memory") else ""),
        ),
        ("retries", str(info["retries"])),
        ("sweep", info["sweep"] or "-"),
    ]
    for key, value in sorted((info["params"] or {}).items()):
        rows.append((f"param {key}", json.dumps(value)))
    rows += [
        ("workdir", info["workdir"]),
        *(
            [("runs in", git["subdir"] + "/ (sub-folder of the workdir)")]
            if git.get("subdir")
            else []
        ),
        ("snapshot", info["snapshot"] or "-"),
        (
            "git",
            (
                f"{git.get('commit') or '-'}"
                + (f" on {git['branch']}" if git.get("branch") else "")
                + (" (uncommitted changes)" if git.get("dirty") else "")
            )
            if git
            else "not a git repository",
        ),
        ("python", info["python"] or "-"),
        ("created", when(info["created_at"])),
        ("started", when(info["started_at"])),
        ("finished", when(info["finished_at"])),
        ("exit code", "-" if info["exit_code"] is None else str(info["exit_code"])),
        ("checkpoints", info["checkpoint_dir"]),
    ]
    for ds in info["datasets"]:
        rows.append((f"dataset {ds['name']}", f"{ds['digest'][:16]} ({ds['source']})"))
    for key, value in sorted(info["env"].items()):
        rows.append((f"env {key}", value if len(value) < 100 else value[:97] + "..."))
    for key, value in rows:
        fields.add_row(key, value)

    if not info["attempts_detail"]:
        attempts: Any = Text("attempts: none yet", style="italic")
    else:
        attempts = Table(title="attempts", title_justify="left", expand=True, box=box.SIMPLE_HEAD)
        for head in ("#", "INSTANCE", "STARTED", "RUNTIME", "EXIT", "REASON"):
            attempts.add_column(head)
        for a in info["attempts_detail"]:
            ran = (a["ended_at"] or now) - a["started_at"] if a["started_at"] else None
            attempts.add_row(
                str(a["n"]),
                a["instance"],
                when(a["started_at"]),
                duration(ran),
                "-" if a["exit_code"] is None else str(a["exit_code"]),
                a["reason"] or ("running" if a["state"] == "live" else "-"),
            )

    events = Table(title="events", title_justify="left", expand=True, box=box.SIMPLE_HEAD)
    for head in ("TIME", "EVENT", "DETAIL"):
        events.add_column(head)
    for e in info["events"][-200:]:
        what = f"{e['old'] or e['kind']} -> {e['new']}" if e["new"] else e["kind"]
        detail = (f"attempt {e['attempt']}: " if e["attempt"] else "") + (e["detail"] or "")
        events.add_row(when(e["ts"]), what, detail)
    last = info.get("last_output")
    tail: list[Any] = []
    if last:  # why a failed job failed, without opening its log
        head = f"last output of attempt {last['attempt']}" + (
            f" ({last['reason']})" if last["reason"] else ""
        )
        tail = [
            Text(head, style="bold red"),
            Text("\n".join(last["lines"]) or "(it printed nothing)"),
            Text(""),
        ]
    return Group(fields, Text(""), *tail, attempts, Text(""), events)
