"""What a page asks before a destructive action (a job's Cancel or Pause, a sweep's
actions on all its runs), as the dashboard does: the job or sweep named, what the action
does and what is lost, its running time. The page (static/web.js) asks it when the form
is submitted, the ``{ran}`` of the question counted on to the moment of the click:
``ran`` seconds at ``now`` (the server's clock), growing with ``live`` runs running."""

from __future__ import annotations

import time

from monkey.models import LIVE, State

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey

RAN = "{ran}"  # where the page writes the running time, when asked


def _ask(text: str, ran: float = 0.0, live: int = 0, now: float = 0.0) -> dict[str, Any]:
    return {"text": text, "ran": round(ran, 1), "live": live, "now": round(now, 1)}


def job_questions(info: dict[str, Any], actions: list[str]) -> dict[str, dict[str, Any]]:
    """Action -> the question asked before it (a job's cancel and pause), for the job INFO
    (``Monkey.info``)."""
    now = time.time()
    state = State(info["state"])
    started = [a["started_at"] for a in info["attempts_detail"] if a.get("state") == "live"]
    running = state in LIVE and bool(started and started[-1])
    ran = now - started[-1] if running else 0.0
    who = f"job {info['job']}" + (f" ({info['name']})" if info.get("name") else "")
    out = {}
    if "cancel" in actions:
        text = (
            f"Cancel {who}? This stops it for good (SIGTERM, then SIGKILL); its {RAN} of "
            "running so far is lost."
            if running
            else f"Cancel {who}? It is {state.value}: cancelled, it never runs (retry queues it again)."
        )
        out["cancel"] = _ask(text, ran, int(running), now)
    if "pause" in actions:
        text = (
            f"Pause {who}? This stops it gracefully and holds it until resumed; what it did "
            f"since its last checkpoint (of its {RAN} of running) is lost."
            if running
            else f"Pause {who}? It is {state.value}: held, it does not start until resumed."
        )
        out["pause"] = _ask(text, ran, int(running), now)
    return out


def sweep_questions(m: Monkey, status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Action -> the question asked before doing it to every run of the sweep STATUS
    (``Monkey.sweep_status``)."""
    now = time.time()
    jobs = status["jobs"]
    by: dict[str, list[str]] = {}
    for j in jobs:
        by.setdefault(j["state"], []).append(j["job"])
    live = [juid for s in LIVE for juid in by.get(s.value, [])]
    ended = [juid for s in ("failed", "cancelled", "preempted", "lost") for juid in by.get(s, [])]
    times = m.runtimes([*live, *ended], now)
    ran_live = sum(times.get(j, 0.0) for j in live)
    queued, paused = len(by.get("queued", [])), len(by.get("paused", []))
    who = f"sweep {status['id']}" + (
        f" ({status['name']})" if status.get("name") and status["name"] != status["id"] else ""
    )
    counts = ", ".join(
        f"{n} {what}"
        for n, what in ((len(live), "running"), (queued, "queued"), (paused, "paused"))
        if n
    )
    lost = f"; {RAN} of running is lost" if live else ""
    idle = "None of its runs is queued or running: nothing is stopped."
    return {
        "cancel": _ask(f"Cancel all of {who}? {idle}")
        if not (live or queued or paused)
        else _ask(
            f"Cancel all of {who}? This stops its {len(live) + queued + paused} unfinished "
            f"runs for good ({counts}){lost}.",
            ran_live,
            len(live),
            now,
        ),
        "pause": _ask(f"Pause all of {who}? {idle}")
        if not (live or queued)
        else _ask(
            f"Pause all of {who}? This stops its {len(live)} running runs gracefully and holds "
            f"them and its {queued} queued ones until resumed"
            + (
                f"; what they did since their last checkpoints (of {RAN} of running) is lost"
                if live
                else ""
            )
            + ".",
            ran_live,
            len(live),
            now,
        ),
        "resume": _ask(f"Resume all of {who}? This queues its {paused} paused runs again."),
        "retry": _ask(
            f"Retry all of {who}? This runs its {len(ended)} failed or cancelled runs again "
            f"as new attempts (they ran {RAN} in all, kept as their earlier attempts).",
            sum(times.get(j, 0.0) for j in ended),
            0,
            now,
        ),
    }
