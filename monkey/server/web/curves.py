"""The runs a page's curves comparison draws (the compare page, a sweep's page): each run's
legend names the parameters that differ between the runs (``lr=0.1 depth=8``), with its
state (to hide the failed ones) and those parameters' values (to group by one). The
curves themselves are drawn in the browser (static/curves.js) from each run's series."""

from __future__ import annotations

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey

MOST = 50  # runs drawn at once (a sweep's first ones, in its table's order)


def jobs_of(m: Monkey, juids: list[str]) -> list[dict[str, Any]]:
    """The runs JUIDS (the first MOST) as ``curve_runs`` takes them: {"job", "state",
    "params"}, as ``Monkey.sweep_status`` lists a sweep's."""
    jobs = []
    for juid in juids[:MOST]:
        try:
            jobs.append(m.get_job(juid))
        except MonkeyError:  # removed since the page was made
            continue
    return [{"job": j.juid, "state": j.state.value, "params": j.params} for j in jobs]


def curve_runs(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """{"runs": [{"job", "label", "state", "params": the differing ones' values}], "params":
    the parameters whose values differ between the runs JOBS ({"job", "state", "params"};
    the first MOST), by name as the runs table's columns; "total": how many runs}."""
    from collections import Counter

    from monkey.server.web.render import cell
    from monkey.tracking.ingest import flatten

    total, jobs = len(jobs), jobs[:MOST]
    params = [flatten(j["params"] or {}) for j in jobs]
    names = sorted({k for p in params for k in p})
    differ = [n for n in names if len({repr(p.get(n)) for p in params}) > 1]
    values = [{n: cell(p[n]) for n in differ if n in p} for p in params]
    labels = [" ".join(f"{n}={v}" for n, v in vs.items()) for vs in values]
    twice = Counter(labels)
    runs = [
        {
            # two runs alike in every parameter: told apart by their ids
            "label": f"{label} ({job['job']})"
            if label and twice[label] > 1
            else label or job["job"],
            "job": job["job"],
            "state": job["state"],
            "params": vs,
        }
        for job, vs, label in zip(jobs, values, labels)
    ]
    return {"runs": runs, "params": differ, "total": total}
