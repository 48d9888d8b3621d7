"""The tracking half of the ``Monkey`` facade: ``Sweeps`` (submit and steer sweeps) and
``Tracking`` (metrics, compare, diff, plots, reports, export), which
``monkey.api.Monkey`` delegates to."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable

from monkey.facade import render
from monkey.models import MonkeyError, Request, State
from monkey.submit import Submission, Submitter, check_priority

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home
    from monkey.store import Store

Series = list[tuple[int | None, float, float]]


class Sweeps:
    """Submit sweeps (one submission shared by their cells), list and steer them. CONTROL
    cancels or pauses one job (``Monkey``'s own, so a sweep's cells end as a job's would)."""

    def __init__(
        self,
        home: Home,
        store: Store,
        submitter: Submitter,
        control: Callable[[str, Request], State],
        wake: Callable[[str | None], None],
    ) -> None:
        self.home = home
        self.store = store
        self.submitter = submitter
        self._control = control
        self._wake = wake  # Monkey.wake: the one door to the core

    # -- sweeps -------------------------------------------------------------------------

    def sweep(
        self,
        command: str | list[str] | None = None,
        *,
        grid: dict[str, list[Any]] | None = None,
        random: int | None = None,
        distributions: dict[str, dict[str, Any]] | None = None,
        file: str | dict[str, Any] | None = None,
        metric: str | None = None,
        goal: str | None = None,
        max_parallel: int | None = None,
        retries: int | None = None,
        early_terminate: str | dict[str, Any] | None = None,
        seed: int | None = None,
        name: str | None = None,
        max_cells: int | None = None,
        after: str | Iterable[str] | None = None,
        after_any: str | Iterable[str] | None = None,
        priority: int = 0,
        notify: str | Iterable[str] | None = None,
        **run_options: Any,
    ) -> str:
        """Create a sweep: one queued job per cell; returns the sweep id.

        ``grid``: name -> values; ``random=N`` draws N cells from ``grid`` values and
        ``distributions`` (name -> {"distribution": "uniform"|"log_uniform"|"int_uniform"|
        "choice", "min", "max" | "values"}); ``file``: a YAML sweep file, or its content
        as ``sweepspec.load_file`` reads it (explicit arguments override it). ``max_cells``: allow more cells than the default cap
        (``sweepspec.MAX_CELLS``). ``after``, ``after_any``, ``priority``: as ``run``'s,
        for every cell.
        ``run_options`` go to ``run`` (provider, cpus, gpus, ...).

        The code and data are stored once for all cells; the cells are written in batches
        (see ``monkey.tracking.sweeps`` for what an interrupted submission leaves).
        """
        from monkey.tracking import sweeps, sweepspec

        spec: dict[str, Any] = (
            dict(file) if isinstance(file, dict) else sweepspec.load_file(file) if file else {}
        )
        params = dict(spec.get("parameters") or {})
        params.update(
            {
                k: {"values": list(v) if isinstance(v, (list, tuple)) else [v]}
                for k, v in (grid or {}).items()
            }
        )
        params.update(distributions or {})
        spec["parameters"] = params
        if command is not None:
            spec["command"] = command
        if random is not None:
            spec["method"], spec["count"] = "random", random
        if metric is not None:
            spec["metric"] = {"name": metric, "goal": goal}  # None: guessed from the name
        elif goal is not None:
            raise MonkeyError("--goal needs --metric NAME (the metric the goal applies to)")
        for key, value in (
            ("max_parallel", max_parallel),
            ("retries", retries),
            ("early_terminate", early_terminate),
            ("seed", seed),
        ):
            if value is not None:
                spec[key] = value
        name = name or spec.pop("name", None)
        spec = sweepspec.check(spec)
        spec["cells"] = sweepspec.size(spec, max_cells)
        cells = sweepspec.expand(spec)
        deps = self.submitter.dependencies(after, after_any)
        check_priority(priority)
        targets = None
        if notify:  # `sweep --notify NAME`: its failures and its end, whatever the rules
            from monkey.submit import job_targets

            targets = job_targets(self.store, self.submitter.acting_user(), notify, sweep=True)
        self.home.socket_path("core")  # a socket folder that cannot be used refuses first
        lock = None
        with (
            self.submitter.blobs().lease()
        ):  # no gc deletes the cells' blobs till they are recorded
            sub = self.submitter.prepare(retries=spec["retries"], **run_options)
            try:
                with self.store.tx():  # the lock is held before anyone sees the sweep
                    sid = self.store.create_sweep(name or "", spec, state=sweeps.SUBMITTING)
                    lock = sweeps.SubmissionLock(self.home, sid)
                self._write_cells(sub, sid, name or sid, spec, cells, deps, priority, targets)
                self.store.set_sweep_state(sid, sweeps.ACTIVE_SWEEP, only_from=[sweeps.SUBMITTING])
            finally:
                if lock is not None:
                    lock.release()
        sweep = self.store.get_sweep(sid)
        assert sweep is not None
        sweeps.advance(self.store, sweep)
        self._wake(f"sweep {sid}")
        return sid

    def _write_cells(
        self,
        sub: Submission,
        sid: str,
        label: str,
        spec: dict[str, Any],
        cells: list[dict[str, Any]],
        after: dict[str, bool],
        priority: int,
        notify: dict[str, str] | None = None,
    ) -> None:
        """Write a submitting sweep's cells, held, in batches; on failure mark it interrupted
        and say how far it got."""
        import time

        from monkey.store.tracking import WRITE_BATCH
        from monkey.tracking import sweeps, sweepspec

        written = 0
        try:
            for start in range(0, len(cells), WRITE_BATCH):
                batch = [
                    (sweepspec.render(spec["command"], cell), f"{label}-{i}", cell)
                    for i, cell in enumerate(cells[start : start + WRITE_BATCH], start + 1)
                ]
                self.submitter.record(
                    sub,
                    batch,
                    sweep=sid,
                    held=True,
                    after=after,
                    priority=priority,
                    notify=notify,
                )
                written += len(batch)
                time.sleep(0.005)  # the lock is free: a waiting writer takes it now
        except MonkeyError as exc:
            with contextlib.suppress(MonkeyError):  # else the next reader marks it
                self.store.set_sweep_state(sid, sweeps.INTERRUPTED, only_from=[sweeps.SUBMITTING])
            raise MonkeyError(
                f"sweep {sid} stopped after {written:,} of its {len(cells):,} "
                f"cells (marked interrupted: none of them will run): {exc}"
            ) from None

    def sweeps(self, state: str | None = None) -> list[dict[str, Any]]:
        """Sweeps, newest first, each with its job counts by state and its tags."""
        from monkey.tracking import sweeps

        sweeps.settle(self.store, self.home)
        out = self.store.list_sweeps(states=[state] if state else None)
        tags = self.store.tags_of("sweep", [s["id"] for s in out])
        for sweep in out:
            sweep["counts"] = self._sweep_counts(sweep["id"])
            sweep["tags"] = tags.get(sweep["id"], [])
        return out

    def _sweep_counts(self, sid: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, state, _, _ in self.store.sweep_jobs_brief(sid):
            counts[state] = counts.get(state, 0) + 1
        return counts

    def sweep_status(self, ref: str) -> dict[str, Any]:
        """Progress of a sweep and its best run so far on its metric."""
        from monkey.models import TERMINAL
        from monkey.tracking import sweeps
        from monkey.tracking.compare import goal_of

        sweeps.settle(self.store, self.home)
        sid = self.store.resolve_sweep(ref)
        sweep = self.store.get_sweep(sid)
        assert sweep is not None
        jobs = self.store.list_jobs(sweep=sid, newest_first=False)
        sweep["counts"] = self._sweep_counts(sid)
        sweep["note"] = self.store.note_of("sweep", sid)  # {"text", "at", "by"} or None
        sweep["tags"] = self.store.tags_of("sweep", [sid]).get(sid, [])
        sweep["total"] = len(jobs)
        sweep["done"] = sum(1 for j in jobs if j.state in TERMINAL)
        sweep["stopped_early"] = [
            j.juid
            for j in jobs
            if any(e["kind"] == "early-stop" for e in self.store.events(j.juid))
        ]
        metric = sweep["spec"].get("metric")
        best = None
        if metric:
            goal = goal_of(metric["name"], {metric["name"]: metric["goal"]})
            stats = self.store.metric_stats([j.juid for j in jobs])
            for job in jobs:
                st = stats[job.juid].get(metric["name"])
                value = (st["max"] if goal == "max" else st["min"]) if st else None
                if value is not None and (
                    best is None or (value > best["value"]) == (goal == "max")
                ):
                    best = {"job": job.juid, "value": value, "params": job.params}
            sweep["logged"] = sorted(
                {n for per in stats.values() for n in per if not n.startswith("sys/")}
            )
        sweep["best"] = best
        sweep["jobs"] = [
            {"job": j.juid, "state": j.state.value, "params": j.params, "attempts": j.attempts}
            for j in jobs
        ]
        return sweep

    def sweep_control(self, ref: str, action: str) -> dict[str, Any]:
        """cancel, pause, resume or retry every cell of a sweep: {"sweep": its id, "jobs":
        how many jobs it touched}."""
        from monkey.models import LIVE, TERMINAL
        from monkey.store.deps import HOLD
        from monkey.tracking import sweeps

        sweeps.settle(self.store, self.home)
        sid = self.store.resolve_sweep(ref)
        sweep = self.store.get_sweep(sid)
        assert sweep is not None
        if sweep["state"] == sweeps.SUBMITTING:
            raise MonkeyError(
                f"sweep {sid} is still being submitted; {action} it once its `monkey sweep` is done"
            )
        if sweep["state"] == sweeps.INTERRUPTED and action != "cancel":
            raise MonkeyError(
                f"sweep {sid} was interrupted while its cells were written; "
                f"`monkey sweep cancel {sid}` and submit it again"
            )
        touched = 0
        jobs = self.store.list_jobs(sweep=sid, newest_first=False)
        if action in ("cancel", "pause"):
            if sweep["state"] in ("finished", "cancelled") or (
                action == "pause" and sweep["state"] == "paused"
            ):
                raise MonkeyError(
                    f"sweep {sid} is already {sweep['state']}; nothing to {action}"
                    + (" (retry re-runs its failed cells)" if action == "cancel" else "")
                )
            self.store.set_sweep_state(sid, "cancelled" if action == "cancel" else "paused")
            for job in jobs:
                if (
                    job.state in LIVE
                    or job.state == State.QUEUED
                    or (action == "cancel" and job.state == State.PAUSED)
                ):
                    try:
                        self._control(
                            job.juid, Request.CANCEL if action == "cancel" else Request.PAUSE
                        )
                        touched += 1
                    except MonkeyError:
                        continue  # ended meanwhile
        elif action in ("resume", "retry"):
            if action == "resume" and sweep["state"] != "paused":
                raise MonkeyError(
                    f"sweep {sid} is {sweep['state']}, not paused; only paused "
                    "sweeps resume (retry re-runs failed cells)"
                )
            wanted = {State.PAUSED} if action == "resume" else set(TERMINAL) - {State.SUCCEEDED}
            for job in jobs:
                if job.state in wanted and self.store.transition(
                    job.juid,
                    job.state,
                    State.QUEUED,
                    kind="user",
                    detail=action,
                    not_before=HOLD,
                    request=None,
                    actor=self.submitter.acting_user(),
                ):
                    touched += 1
            if action == "retry" and not touched:
                raise MonkeyError(f"sweep {sid} has no failed, cancelled or lost cells to retry")
            self.store.set_sweep_state(sid, "running")
            sweep = self.store.get_sweep(sid)
            assert sweep is not None
            sweeps.advance(self.store, sweep)
        else:
            raise MonkeyError(
                f"unknown sweep action {action!r}; use cancel, pause, resume or retry"
            )
        self._wake(None)
        return {"sweep": sid, "jobs": touched}


class Tracking:
    """Metrics, compare, diff, plots, reports and export; SWEEPS gives a sweep's status."""

    def __init__(self, home: Home, store: Store, sweeps: Sweeps) -> None:
        self.home = home
        self.store = store
        self._sweeps = sweeps

    # -- metrics ------------------------------------------------------------------------

    def metrics(self, ref: str, name: str | None = None) -> dict[str, Series]:
        """Series name -> [(step, value, wall_time)] in logging order (NaN stays NaN)."""
        juid = self.store.resolve(ref)
        out = self.store.metric_points(juid, name)
        if name is not None and not out:
            known = ", ".join(self.store.metric_names(juid)) or "none yet"
            raise MonkeyError(f"job {juid} has no metric {name!r}; its metrics: {known}")
        return {
            k: [(s, math.nan if v is None else v, w) for s, v, w in pts] for k, pts in out.items()
        }

    def metric_names(self, ref: str) -> list[str]:
        """Names of the job's metric series, sorted."""
        return self.store.metric_names(self.store.resolve(ref))

    # -- compare and diff ---------------------------------------------------------------

    def compare(
        self,
        refs: list[str] | None = None,
        *,
        sweep: str | None = None,
        sort: str | None = None,
        reverse: bool = False,
        system: bool = False,
    ) -> dict[str, Any]:
        """{"columns", "rows", "sorted_by"}: parameters and final/best metrics of jobs or a
        sweep's runs, and the column the rows are ordered by (None: as given).

        A sweep's table is sorted best first on its metric unless ``sort`` names a column.
        """
        from monkey.tracking.compare import compare, descending, sort_rows

        goals: dict[str, str] = {}
        ranked_on = None
        if sweep is not None:
            if refs:
                raise MonkeyError("give either jobs or --sweep, not both")
            sid = self.store.resolve_sweep(sweep)
            record = self.store.get_sweep(sid)
            assert record is not None
            jobs = self.store.list_jobs(sweep=sid, newest_first=False)
            metric = record["spec"].get("metric")
            if metric:
                goals[metric["name"]] = metric["goal"]
                ranked_on = None if sort else metric["name"] + ":best"
        else:
            if not refs:
                raise MonkeyError("name the jobs to compare (or --sweep S)")
            juids = list(dict.fromkeys(self.store.resolve(r) for r in refs))
            jobs = [j for j in (self.store.get_job(juid) for juid in juids) if j is not None]
        result = compare(self.store, jobs, goals, sort, reverse, system)
        result["sorted_by"] = sort
        if (
            ranked_on is not None and ranked_on in result["columns"]
        ):  # no run logging the sweep's metric keeps job order
            metrics = [c for c in result["columns"] if f"{c}:best" in result["columns"]]
            result["rows"] = sort_rows(
                result["rows"], ranked_on, descending(ranked_on, metrics, goals) != reverse
            )
            result["sorted_by"] = ranked_on
        return result

    def diff(self, ref_a: str, ref_b: str) -> dict[str, Any]:
        """What differs between two jobs (see ``monkey.tracking.diff.diff_jobs``)."""
        from monkey.snapshot.blobs import BlobStore
        from monkey.tracking.diff import diff_jobs
        from monkey.tracking.packages import from_text

        jobs = [self.store.get_job(self.store.resolve(r)) for r in (ref_a, ref_b)]
        a, b = jobs
        assert a is not None and b is not None
        blobs = BlobStore(self.home.blobs)
        digests = [self.store.job_packages(j.juid) for j in (a, b)]
        packages = None
        if all(digests):
            pa, pb = (from_text(blobs.read_bytes(d)) for d in digests)  # type: ignore[arg-type]
            packages = (pa, pb)
        out = diff_jobs(blobs, a, b, packages)
        reruns = [(self.store.rerun_of(j.juid) or {}).get("job") for j in (a, b)]
        if reruns[0] != reruns[1]:
            out["rerun_of"] = reruns
        images = [self.store.job_image(j.juid) for j in (a, b)]
        if images[0] != images[1]:  # "ref @ digest", or None: no image
            out["image"] = [i and f"{i['ref']} @ {i['digest']}" for i in images]
        return out

    # -- plots and reports --------------------------------------------------------------

    def plot(
        self,
        refs: list[str],
        metrics: list[str] | str | None,
        out: str,
        x: str = "step",
        size: tuple[int, int] = (1000, 600),
        *,
        smooth: float = 0.0,
        log_y: bool = False,
        sweep: str | None = None,
    ) -> str:
        """Write a PNG (SVG, PDF by suffix) of METRICS across jobs, or a sweep's runs (its
        metric by default): one panel per metric, runs named by the parameters that differ;
        ``smooth``: EMA weight in [0, 1); ``x``: step, epoch or time. Returns its path."""
        return render.plot(self.plot_data, refs, metrics, out, x, size, smooth, log_y, sweep)

    def plot_data(
        self,
        refs: list[str],
        metrics: list[str] | str | None,
        x: str = "step",
        *,
        smooth: float = 0.0,
        log_y: bool = False,
        sweep: str | None = None,
    ) -> dict[str, Any]:
        """What ``plot`` draws: {"charts": metric -> run -> series, "style": plots.Style's
        fields} (plain data: a remote's client draws it)."""
        from dataclasses import asdict

        if not 0 <= smooth < 1:
            raise MonkeyError(f"monkey plot: --smooth {smooth} is outside [0, 1); try 0.6")
        names = [metrics] if isinstance(metrics, str) else list(metrics or [])
        if sweep is not None:
            if refs:
                raise MonkeyError("monkey plot: give either jobs or --sweep, not both")
            sid = self.store.resolve_sweep(sweep)
            record = self.store.get_sweep(sid)
            assert record is not None
            refs = [j.juid for j in self.store.list_jobs(sweep=sid, newest_first=False)]
            if not names and record["spec"].get("metric"):
                names = [record["spec"]["metric"]["name"]]
            if not refs:
                raise MonkeyError(f"sweep {sid} has no runs yet")
        if not names:
            raise MonkeyError("monkey plot: name the metric to draw with --metric NAME")
        if not refs:
            raise MonkeyError("monkey plot: name the jobs to draw, or a sweep with --sweep")
        juids = list(dict.fromkeys(self.store.resolve(r) for r in refs))
        charts, style = self.chart_data(juids, names, x, smooth=smooth, log_y=log_y)
        if not any(charts.values()):
            raise MonkeyError(
                f"no job among {', '.join(juids[:5])} logged "
                f"{' or '.join(map(repr, names))}; see `monkey metrics {juids[0]}`"
            )
        return {"charts": charts, "style": asdict(style)}

    def chart_data(
        self,
        juids: list[str],
        names: list[str],
        x: str = "step",
        *,
        smooth: float = 0.0,
        log_y: bool = False,
    ) -> tuple[dict[str, dict[str, Series]], Any]:
        """(metric -> run label -> series, plots.Style) for charts of NAMES across JUIDS: runs
        labelled by the parameters that differ; past 20 runs coloured by a numeric parameter."""
        from monkey.tracking.charts import colour_param, run_labels
        from monkey.tracking.plots import X_AXES, Style

        if x not in X_AXES:
            raise MonkeyError(f"x axis {x!r} is not one of {', '.join(X_AXES)}")
        params = {}
        for juid in juids:
            job = self.store.get_job(juid)
            params[juid] = job.params if job else {}
        labels = run_labels(params)
        charts = {}
        for name in names:
            found = self.store.metric_points_many(juids, name)
            charts[name] = {
                labels[j]: [(s, math.nan if v is None else v, w) for s, v, w in found[j]]
                for j in juids
                if j in found
            }
        style = Style(x=x, smooth=smooth, log_y=log_y)
        if x == "epoch":
            found = self.store.metric_points_many(juids, "epoch")
            if not found:
                raise MonkeyError(
                    "x by epoch needs runs that log 'epoch' (monkey.log('epoch', "
                    "e, step=...)); use --x step"
                )
            style.epochs = {
                labels[j]: [(s, math.nan if v is None else v, w) for s, v, w in pts]
                for j, pts in found.items()
            }
        by = colour_param(params) if len(juids) > 20 else None
        if by:
            style.by_name = by
            style.by = {labels[j]: float(p[by]) for j, p in params.items() if by in p}
        return charts, style

    def sweep_analysis(self, ref: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
        """Parameter importance, the best run and the best value over time on the sweep's
        metric (see ``monkey.tracking.sweep_analysis``), with each run's value: {"method",
        "importance", "best", "best_so_far", "runs", "metric"}."""
        from monkey.tracking.sweep_analysis import METHOD, analyse

        status = status or self._sweeps.sweep_status(ref)
        metric = status["spec"].get("metric")
        if not metric:
            return {
                "method": METHOD,
                "importance": {},
                "best": None,
                "best_so_far": [],
                "runs": [],
                "metric": None,
            }
        juids = [j["job"] for j in status["jobs"]]
        stats = self.store.metric_stats(juids)
        found = self.store.metric_points_many(juids, metric["name"])
        runs = []
        for j in status["jobs"]:
            st = stats[j["job"]].get(metric["name"])
            value = st and (st["max"] if metric["goal"] == "max" else st["min"])
            if value is None:
                continue
            pts = found.get(j["job"])
            runs.append(
                {
                    "job": j["job"],
                    "params": j["params"],
                    "value": value,
                    "ended": pts[-1][2] if pts else None,
                }
            )
        result = analyse(runs, metric["goal"])
        result.update(runs=runs, metric=metric)
        return result

    def report(
        self, ref: str | None, out: str, jobs: list[str] | None = None, title: str | None = None
    ) -> str:
        """Write a self-contained HTML report of the sweep REF, or of the JOBS (refs) under
        TITLE; returns its path."""
        return render.report(self.report_data, ref, out, jobs, title)

    def report_data(
        self, ref: str | None, jobs: list[str] | None = None, title: str | None = None
    ) -> dict[str, Any]:
        """What ``report`` writes, as plain data (a remote's client renders it): {"status"
        and "analysis" (a sweep's) or "title" and "summary" (jobs'), "table", "charts",
        "style"}."""
        from dataclasses import asdict

        if ref is not None:
            status = self._sweeps.sweep_status(ref)
            table = self.compare(sweep=status["id"])
            juids = [j["job"] for j in status["jobs"]]
        else:
            table = self.compare(jobs)
            records = [self.store.get_job(row["job"]) for row in table["rows"]]
            juids = [j.juid for j in records if j is not None]
        names = sorted(
            {n for j in juids for n in self.store.metric_names(j) if not n.startswith("sys/")}
        )
        charts, style = self.chart_data(juids, names)
        data = {"table": table, "charts": charts, "style": asdict(style)}
        if ref is not None:
            return {**data, "status": status, "analysis": self.sweep_analysis(ref, status)}
        summary = [
            {"job": j.juid, "state": j.state.value, "command": j.command}
            for j in records
            if j is not None
        ]
        return {**data, "title": title or f"{len(summary)} jobs", "summary": summary}

    def select_jobs(
        self, refs: list[str], name: str | None = None, since: str | None = None
    ) -> tuple[list[str], str]:
        """The jobs chosen by REFS, a NAME pattern (shell-style) and SINCE (an age: 12h),
        the filters narrowing each other, oldest first; and words saying how."""
        import time
        from fnmatch import fnmatchcase

        from monkey.housekeeping import parse_age

        if refs:
            found = (self.store.get_job(self.store.resolve(r)) for r in dict.fromkeys(refs))
            jobs = [j for j in found if j]
        else:
            jobs = self.store.list_jobs(newest_first=False)
        words = [f"jobs {', '.join(refs)}"] if refs else ["jobs"]
        if name:
            jobs = [j for j in jobs if fnmatchcase(j.name, name)]
            words.append(f"named {name}")
        if since:
            cut = time.time() - parse_age(since)
            jobs = [j for j in jobs if j.created_at >= cut]
            words.append(f"created in the last {since}")
        if not jobs:
            raise MonkeyError(f"no {' '.join(words)}; see `monkey list jobs`")
        return [j.juid for j in jobs], " ".join(words)

    def export(
        self,
        refs: list[str] | None = None,
        *,
        sweep: str | None = None,
        to: str | None = None,
        csv_dir: str | None = None,
    ) -> dict[str, int]:
        """Write jobs (REFS, a sweep's, or every job when neither is given) as a tidy analysis
        database TO (SQLite; an earlier export is updated) and/or CSV files in CSV_DIR; the
        count of rows of each table (see ``monkey.facade.export``)."""
        from monkey.facade.export import export

        return export(self, self.export_jobs(refs, sweep), to, csv_dir)

    def export_jobs(self, refs: list[str] | None = None, sweep: str | None = None) -> list[str]:
        """The ids of the jobs ``export`` writes: REFS, SWEEP's, or every job, oldest first;
        MonkeyError when there are none."""
        if refs and sweep:
            raise MonkeyError("monkey export: give either jobs or --sweep, not both")
        if sweep is not None:
            sid = self.store.resolve_sweep(sweep)
            juids = [j.juid for j in self.store.list_jobs(sweep=sid, newest_first=False)]
        elif refs:
            juids = list(dict.fromkeys(self.store.resolve(r) for r in refs))
        else:
            juids = [j.juid for j in self.store.list_jobs(newest_first=False)]
        if not juids:
            raise MonkeyError(
                "monkey export: no jobs to export"
                + (f" (sweep {sweep} has none)" if sweep else "; run some first")
            )
        return juids

    def export_rows(self, juids: list[str]) -> list[tuple[str, dict[str, Any]]]:
        """(table, record) of every row an export holds for JUIDS (a remote's client writes
        them; see ``monkey.facade.export.rows``)."""
        from monkey.facade.export import rows

        return list(rows(self, juids))
