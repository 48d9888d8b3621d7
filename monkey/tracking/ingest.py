"""Turn the agent's metrics and heartbeat events into stored metric points.

Called by the core for every pushed event. Each event is stored in one transaction with
the attempt's events offset, so a replayed event (core restart, agent reconnect) is
recognised and skipped: nothing is lost or stored twice.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import sys
from array import array
from collections.abc import Mapping

from monkey.client_agent.track import NO_STEP
from monkey.models import human_size
from monkey.store import Store
from monkey.store.tracking import Columns

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

Point = tuple[str, int | None, float | None, float]  # name, step, value (None: NaN), wall

log = logging.getLogger("monkey.tracking")
MIB = 1 << 20


def on_metrics(store: Store, juid: str, n: int, offset: int, event: dict[str, Any]) -> bool:
    """Store a ``metrics`` event; False when it was stored before."""
    batches, params, summary = parse_log_lines(event.get("lines") or "", juid)
    scraped = parse_scraped(event.get("stdout") or "", float(event.get("ts") or 0.0))
    if scraped:
        batches.append(as_columns(scraped))
    return store.ingest_metrics(juid, n, offset, batches, params or None, summary or None)


def on_heartbeat(store: Store, juid: str, n: int, offset: int, event: dict[str, Any]) -> None:
    """Store a heartbeat and its system metrics (sys/cpu, sys/mem in MiB, sys/gpuN_*)."""
    ts = float(event["ts"])
    cpu, rss = event.get("cpu"), event.get("rss")
    points: list[Point] = []
    if isinstance(cpu, (int, float)):
        points.append(("sys/cpu", None, float(cpu), ts))
    if isinstance(rss, int):
        points.append(("sys/mem", None, rss / MIB, ts))
    for gpu in event.get("gpus") or []:
        for key in ("util", "mem"):
            if isinstance(gpu.get(key), (int, float)):
                points.append((f"sys/gpu{gpu['index']}_{key}", None, float(gpu[key]), ts))
    store.heartbeat_metrics(
        juid, n, ts, offset, cpu, rss, as_columns(points) if points else None, _phase(event)
    )


def _phase(event: dict[str, Any]) -> str | None:
    """What a heartbeat says the attempt does before its command: "pulling 12.0 MB of
    45.2 MB" while its image is pulled, or the worker's own one line ("pending 0/3 nodes are
    available: ...": a Kubernetes pod); None once its command runs."""
    said = event.get("phase")
    if isinstance(said, str) and said:
        return said[:300]
    pull = event.get("pull")
    if not isinstance(pull, dict) or not isinstance(pull.get("bytes"), int):
        return None
    total = pull.get("total")
    done = human_size(pull["bytes"])
    return f"pulling {done} of {human_size(total)}" if isinstance(total, int) else f"pulling {done}"


def as_columns(points: list[Point]) -> Columns:
    """Point tuples as a batch of columns."""
    index: dict[str, int] = {}
    positions = [index.setdefault(p[0], len(index)) for p in points]
    return (
        list(index),
        positions,
        [p[1] for p in points],
        [p[2] for p in points],
        [p[3] for p in points],
    )


def points_of(batches: list[Columns]) -> list[Point]:
    """The point tuples of batches, in order (for tests and small batches)."""
    return [
        (names[i], s, v if v == v else None, w)
        for names, index, steps, values, walls in batches
        for i, s, v, w in zip(index, steps, values, walls)
    ]


def parse_log_lines(
    text: str, juid: str = ""
) -> tuple[list[Columns], dict[str, Any], dict[str, Any]]:
    """Batches, params and summary from metrics.jsonl lines (bad lines are logged, skipped)."""
    lines = text.splitlines()
    try:
        values = json.loads("[" + ",".join(lines) + "]")
    except ValueError:
        values = []
        for line in lines:
            try:
                values.append(json.loads(line))
            except ValueError:
                if line.strip():
                    log.warning("%s: skipped a bad metrics line: %.80s", juid, line)
    batches: list[Columns] = []
    params: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for value in values:
        if isinstance(value, list):
            points = _batch(value, juid)
            if points:
                batches.append(as_columns(points))
        elif isinstance(value, dict):
            if "columns" in value:
                batch = _columns(value["columns"], juid)
                if batch is not None:
                    batches.append(batch)
            params.update(value.get("params") or {})
            summary.update(value.get("summary") or {})
    return batches, params, summary


def _batch(batch: list[Any], juid: str) -> list[Point]:
    try:
        return [
            (name, step, value if value == value else None, wall / 1e9)
            for name, step, value, wall in batch
            if name.__class__ is str
            and (step is None or step.__class__ is int)
            and value.__class__ in (float, int)
        ]
    except (TypeError, ValueError):
        log.warning("%s: skipped a malformed batch of %d points", juid, len(batch))
        return []


def _columns(body: Any, juid: str) -> Columns | None:
    """Points of a {"columns": ...} batch (see monkey.client_agent.track)."""
    try:
        names = body["names"]
        n, s, v, t = array("H"), array("q"), array("d"), array("q")
        for column, key in ((n, "n"), (s, "s"), (v, "v"), (t, "t")):
            column.frombytes(base64.b64decode(body[key], validate=True))
            if sys.byteorder == "big":
                column.byteswap()
        if (
            not (len(n) == len(s) == len(v) == len(t))
            or (n and max(n) >= len(names))
            or not all(isinstance(name, str) for name in names)
        ):
            raise ValueError("inconsistent columns")
    except (KeyError, TypeError, ValueError, binascii.Error):
        log.warning("%s: skipped a malformed batch of metrics", juid)
        return None
    steps: Any = s
    if NO_STEP in s:
        steps = [None if step == NO_STEP else step for step in s]
    return names, n, steps, v, map((1e-9).__mul__, t)


def parse_scraped(text: str, ts: float) -> list[Point]:
    """Points from {"experiment": {...}} / {"monkey": {...}} lines printed by the job."""
    points: list[Point] = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a line that only looked like one: it stays plain output
        if not isinstance(obj, dict) or len(obj) != 1:
            continue
        key, body = next(iter(obj.items()))
        if key not in ("experiment", "monkey") or not isinstance(body, dict):
            continue
        # The step is `step`, else `epoch` (the StudioML convention logs per epoch).
        step_key = next((k for k in ("step", "epoch") if _is_int(body.get(k))), None)
        step = body[step_key] if step_key else None
        for name, value in flatten(body).items():
            if name == step_key:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                points.append((name, step, None if math.isnan(value) else float(value), ts))
    return points


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1}} -> {"optim.lr": 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
