"""`monkey export`: jobs, parameters, metrics and output as a tidy analysis database (and/or
CSV files) that pandas, Datasette or any SQLite tool opens.

Tables (long, one fact per row; times in UTC ISO 8601, metric wall times in epoch seconds):

- ``jobs``: one row per job (``job`` is the key): name, state, command, provider, sweep,
  created/started/finished, runtime_s, exit_code, resources, git commit, python.
- ``params``: (job, name, value): the job's parameters, nested ones flattened (``opt.lr``).
- ``metrics``: (job, name, seq, step, value, wall_time): every logged point, ``seq`` its
  place in the series.
- ``summaries``: (job, name, value): what ``monkey.summary`` recorded.
- ``attempts``: (job, attempt): where and how each attempt ran and ended.
- ``outputs``: (job, attempt, stream, text, bytes, omitted): what each attempt printed (its
  last ``OUTPUT_MAX`` bytes; ``omitted`` says how many came before).
- ``sweeps``: one row per sweep the jobs belong to.

Full-text search (FTS5) covers ``jobs`` (command, name) and ``outputs`` (text). sqlite-utils
creates the tables, upserts the rows (a re-export updates what changed and keeps the rest)
and sets up the search; monkey's own database is only read, through its store. The export
is written to a copy of the target that replaces it at the end: an interrupted export
leaves the old file as it was.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from monkey.client_agent import rundir
from monkey.models import TERMINAL, MonkeyError, wall_span

if TYPE_CHECKING:
    from monkey.config import Home
    from monkey.models import Attempt, Job
    from monkey.store import Store


class Source(Protocol):
    """What an export reads: a MONKEY_HOME and its store (Monkey, or its tracking part)."""

    home: Home
    store: Store


OUTPUT_MAX = 8 << 20  # bytes of each attempt's stdout/stderr kept, from its end

# Table -> (its columns and their types, in order; its primary key). ``bytes`` declares a
# BLOB column, which SQLite stores values in as they come: a parameter 0.1 stays a number,
# "sgd" stays text.
ANY = bytes
TABLES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "jobs": (
        {
            "job": str,
            "name": str,
            "state": str,
            "command": str,
            "provider": str,
            "instance": str,
            "sweep": str,
            "created_at": str,
            "started_at": str,
            "finished_at": str,
            "runtime_s": float,
            "exit_code": int,
            "reason": str,
            "attempts": int,
            "retries": int,
            "cpus": int,
            "gpus": int,
            "memory": str,
            "time_limit_s": int,
            "git_commit": str,
            "git_dirty": int,
            "python": str,
            "workdir": str,
        },
        ("job",),
    ),
    "params": ({"job": str, "name": str, "value": ANY}, ("job", "name")),
    "metrics": (
        {"job": str, "name": str, "seq": int, "step": int, "value": float, "wall_time": float},
        ("job", "name", "seq"),
    ),
    "summaries": ({"job": str, "name": str, "value": ANY}, ("job", "name")),
    "attempts": (
        {
            "job": str,
            "attempt": int,
            "instance": str,
            "state": str,
            "started_at": str,
            "ended_at": str,
            "runtime_s": float,
            "exit_code": int,
            "signal": int,
            "reason": str,
        },
        ("job", "attempt"),
    ),
    "outputs": (
        {"job": str, "attempt": int, "stream": str, "text": str, "bytes": int, "omitted": int},
        ("job", "attempt", "stream"),
    ),
    "sweeps": (
        {
            "sweep": str,
            "name": str,
            "state": str,
            "method": str,
            "metric": str,
            "goal": str,
            "command": str,
            "created_at": str,
        },
        ("sweep",),
    ),
}
SEARCHED = {"jobs": ("command", "name"), "outputs": ("text",)}
INDEXES = {
    "params": ("name", "value"),
    "metrics": ("name", "step"),
    "summaries": ("name",),
    "jobs": ("sweep",),
}
BATCH = 5000
PAGE = 20  # jobs whose rows a remote export asks for at once


def iso(ts: float | None) -> str | None:
    """Epoch seconds as UTC ISO 8601 (``2026-11-27T09:05:11Z``); None stays None."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _value(v: Any) -> Any:
    """A cell: numbers and text as they are, lists and mappings as JSON, NaN as NULL."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return v


def _job_row(job: Job) -> dict[str, Any]:
    end = job.finished_at or (time.time() if job.started_at and job.state not in TERMINAL else None)
    return {
        "job": job.juid,
        "name": job.name,
        "state": job.state.value,
        "command": job.command,
        "provider": job.provider,
        "instance": job.instance,
        "sweep": job.sweep,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "runtime_s": None if (ran := wall_span(job.started_at, end)) is None else round(ran, 3),
        "exit_code": job.exit_code,
        "reason": job.reason,
        "attempts": job.attempts,
        "retries": job.retries,
        "cpus": job.resources.cpus,
        "gpus": job.resources.gpus,
        "memory": job.resources.memory,
        "time_limit_s": job.resources.time,
        "git_commit": (job.git or {}).get("commit"),
        "git_dirty": None if not job.git else bool(job.git.get("dirty")),
        "python": job.python,
        "workdir": job.workdir,
    }


def _attempt_row(a: Attempt) -> dict[str, Any]:
    runtime = wall_span(a.started_at, a.ended_at)
    return {
        "job": a.juid,
        "attempt": a.n,
        "instance": a.instance,
        "state": a.state,
        "started_at": iso(a.started_at),
        "ended_at": iso(a.ended_at),
        "runtime_s": None if runtime is None else round(runtime, 3),
        "exit_code": a.exit_code,
        "signal": a.signal,
        "reason": a.reason,
    }


def _tail(path: Path) -> tuple[str, int, int] | None:
    """(the last OUTPUT_MAX bytes as text, the file's size, bytes left out), None if absent."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - OUTPUT_MAX))
            data = fh.read(OUTPUT_MAX)
    except FileNotFoundError:
        return None
    return data.decode(errors="replace"), size, size - len(data)


def rows(m: Source, juids: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(table, record) of every row the export holds for JUIDS, read through the store."""
    from monkey.tracking.ingest import flatten

    sweeps: dict[str, None] = {}
    summaries = m.store.summaries(juids)
    for juid in juids:
        job = m.store.get_job(juid)
        if job is None:
            continue  # deleted meanwhile
        yield "jobs", _job_row(job)
        if job.sweep:
            sweeps[job.sweep] = None
        for name, value in flatten(job.params).items():
            yield "params", {"job": juid, "name": name, "value": _value(value)}
        for name, value in summaries.get(juid, {}).items():
            yield "summaries", {"job": juid, "name": name, "value": _value(value)}
        for name, points in m.store.metric_points(juid).items():
            for seq, (step, value, wall) in enumerate(points, start=1):
                yield (
                    "metrics",
                    {
                        "job": juid,
                        "name": name,
                        "seq": seq,
                        "step": step,
                        "value": _value(value),
                        "wall_time": wall,
                    },
                )
        for attempt in m.store.attempts(juid):
            yield "attempts", _attempt_row(attempt)
            if not attempt.run_dir:
                continue
            for stream in ("stdout", "stderr"):
                found = _tail(m.home.run_dir(juid, attempt.n) / rundir.stream_log(stream))
                if found:
                    text, size, omitted = found
                    yield (
                        "outputs",
                        {
                            "job": juid,
                            "attempt": attempt.n,
                            "stream": stream,
                            "text": text,
                            "bytes": size,
                            "omitted": omitted,
                        },
                    )
    for sid in sweeps:
        sweep = m.store.get_sweep(sid)
        if sweep is None:
            continue
        spec, metric = sweep["spec"], sweep["spec"].get("metric") or {}
        yield (
            "sweeps",
            {
                "sweep": sid,
                "name": sweep["name"],
                "state": sweep["state"],
                "method": spec.get("method"),
                "metric": metric.get("name"),
                "goal": metric.get("goal"),
                "command": " ".join(spec["command"]),
                "created_at": iso(sweep["created_at"]),
            },
        )


def paged(
    fetch: Callable[[list[str]], Iterable[Iterable[Any]]], juids: list[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of JUIDS as ``rows`` gives them, fetched PAGE jobs at a time (a remote's
    ``export_rows``); a sweep's row once."""
    seen: set[str] = set()
    for i in range(0, len(juids), PAGE):
        for table, record in fetch(juids[i : i + PAGE]):
            if table == "sweeps":
                if record["sweep"] in seen:
                    continue
                seen.add(record["sweep"])
            yield table, record


def check_targets(m: Source | None, to: str | None, csv_dir: str | None) -> None:
    """MonkeyError unless TO is a new file or an earlier export in an existing folder, and
    CSV_DIR a folder (made if missing) that is not a file."""
    if not to and not csv_dir:
        raise MonkeyError("monkey export: say where: --to runs.db (a SQLite file) and/or --csv DIR")
    if to:
        target = Path(to)
        if target.is_dir():
            raise MonkeyError(
                f"monkey export: {to} is a folder; name the file to write, e.g. "
                f"{target / 'runs.db'}"
            )
        if not target.parent.is_dir():
            raise MonkeyError(
                f"monkey export: folder {target.parent} does not exist; create it "
                "or write somewhere else"
            )
        if m is not None and target.exists() and target.resolve() == m.home.db.resolve():
            raise MonkeyError(
                f"monkey export: {to} is monkey's own database; write the export "
                "to another file, e.g. runs.db"
            )
        if target.exists() and target.stat().st_size:
            _check_earlier_export(target)
    if csv_dir and Path(csv_dir).exists() and not Path(csv_dir).is_dir():
        raise MonkeyError(
            f"monkey export: --csv {csv_dir} is a file; give a folder to write the CSV files in"
        )


def _check_earlier_export(target: Path) -> None:
    """MonkeyError unless TARGET is a SQLite file holding only tables an export writes."""
    try:
        with open(target, "rb") as fh:
            header = fh.read(16)
        if header != b"SQLite format 3\x00":
            raise MonkeyError(
                f"monkey export: {target} is not a SQLite database; give a new "
                "file or an earlier export"
            )
        import sqlite_utils

        db = sqlite_utils.Database(sqlite3.connect(f"file:{target}?mode=ro", uri=True))
        try:
            names = db.table_names()
        finally:
            db.close()
    except (OSError, sqlite3.DatabaseError) as exc:
        raise MonkeyError(f"monkey export: cannot read {target}: {exc}") from None
    ours = set(TABLES) | {f"{t}_fts" for t in SEARCHED}
    foreign = sorted(
        n
        for n in names
        if n not in ours
        and not n.startswith(tuple(f"{t}_fts_" for t in SEARCHED))
        and not n.startswith("sqlite_")
    )
    if foreign:
        raise MonkeyError(
            f"monkey export: {target} is not a monkey export (it has tables "
            f"{', '.join(foreign[:5])}); give a new file or an earlier export"
        )


def export(
    m: Source | None,
    juids: list[str],
    to: str | None = None,
    csv_dir: str | None = None,
    fetch: Callable[[list[str]], Iterable[Iterable[Any]]] | None = None,
) -> dict[str, int]:
    """Write the jobs JUIDS to the SQLite file TO (upserting into an earlier export) and/or
    one CSV file per table in CSV_DIR; the count of rows of each table. The rows are read
    from M's store, or with FETCH (a remote's ``export_rows``) a page of jobs at a time."""
    check_targets(m, to, csv_dir)
    counts = dict.fromkeys(TABLES, 0)
    tmp = f"{to}.tmp-{os.getpid()}" if to else None
    writers: dict[str, Any] = {}
    files: list[Any] = []
    try:
        db = _open_copy(to, tmp) if to and tmp else None
        if csv_dir:
            os.makedirs(csv_dir, exist_ok=True)
            for table, (columns, _) in TABLES.items():
                fh = open(
                    os.path.join(csv_dir, f"{table}.csv.tmp"), "w", newline="", encoding="utf-8"
                )
                files.append(fh)
                writers[table] = csv.DictWriter(fh, fieldnames=list(columns))
                writers[table].writeheader()
        batches: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
        if fetch is not None:
            found = paged(fetch, juids)
        elif m is not None:
            found = rows(m, juids)
        else:
            raise MonkeyError("monkey export: nothing to read the jobs from")
        for table, record in found:
            counts[table] += 1
            if table in writers:
                writers[table].writerow(record)
            if db is not None:
                batches[table].append(record)
                if len(batches[table]) >= BATCH:
                    _upsert(db, table, batches[table])
                    batches[table] = []
        if db is not None:
            for table, batch in batches.items():
                _upsert(db, table, batch)
            _finish(db)
            db.close()
        for fh in files:
            fh.close()
        if csv_dir:
            for table in TABLES:
                path = os.path.join(csv_dir, f"{table}.csv")
                os.replace(f"{path}.tmp", path)
        if to and tmp:
            os.replace(tmp, to)
    except OSError as exc:
        raise MonkeyError(
            f"monkey export: cannot write {exc.filename or to or csv_dir}: {exc.strerror or exc}"
        ) from None
    finally:
        for fh in files:
            fh.close()
        leftovers = [tmp] if tmp else []
        if csv_dir:
            leftovers += [os.path.join(csv_dir, f"{t}.csv.tmp") for t in TABLES]
        for path in leftovers:
            if path and os.path.exists(path):
                os.unlink(path)
    return counts


def _open_copy(to: str, tmp: str) -> Any:
    """A sqlite-utils Database over TMP (a copy of the earlier export TO, or a new file) with
    every table created, typed and keyed."""
    import sqlite_utils

    if os.path.exists(to) and os.path.getsize(to):
        shutil.copyfile(to, tmp)
        shutil.copymode(to, tmp)  # a runs.db made private stays so
    db = sqlite_utils.Database(tmp)
    for table, (columns, pk) in TABLES.items():
        db.table(table).create(columns, pk=_key(pk), if_not_exists=True)
    return db


def _key(pk: tuple[str, ...]) -> str | tuple[str, ...]:
    return pk[0] if len(pk) == 1 else pk


def _upsert(db: Any, table: str, batch: list[dict[str, Any]]) -> None:
    """Upsert BATCH into TABLE: new rows added, rows with the same key updated."""
    if batch:
        db[table].upsert_all(batch, pk=_key(TABLES[table][1]))


def _finish(db: Any) -> None:
    """The tables' indexes, and full-text search kept in step with the rows by triggers."""
    for table, names in INDEXES.items():
        for name in names:
            db[table].create_index([name], if_not_exists=True, find_unique_name=False)
    for table, names in SEARCHED.items():
        if db[table].detect_fts() is None:
            db[table].enable_fts(list(names), create_triggers=True)
