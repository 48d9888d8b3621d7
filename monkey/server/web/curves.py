"""The runs a page's curves comparison draws (the compare page, a sweep's page): each run's
legend names the parameters that differ between the runs (``lr=0.1 depth=8``), with its
state (to hide the failed ones) and those parameters' values (to group by one). The
curves themselves are drawn in the browser (static/curves.js) from each run's series."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey

MOST = 50  # runs drawn at once (a sweep's first ones, in its table's order)


def curve_runs(m: Monkey, juids: list[str]) -> dict[str, Any]:
    """{"runs": [{"job", "label", "state", "params": the differing ones' values}], "params":
    the parameters whose values differ between the runs JUIDS (the first MOST), in the
    order the runs name them; "total": how many runs were given}."""
    from monkey.server.web.views import cell
    from monkey.tracking.ingest import flatten

    jobs = [j for j in (m.store.get_job(juid) for juid in juids[:MOST]) if j is not None]
    params = [flatten(j.params or {}) for j in jobs]
    names = sorted({k for p in params for k in p})
    differ = [n for n in names if len({repr(p.get(n)) for p in params}) > 1]
    runs = []
    for job, p in zip(jobs, params):
        values = {n: cell(p[n]) for n in differ if n in p}
        label = " ".join(f"{n}={v}" for n, v in values.items()) or job.juid
        runs.append({"job": job.juid, "label": label, "state": job.state.value, "params": values})
    seen: dict[str, int] = {}
    for r in runs:
        seen[r["label"]] = seen.get(r["label"], 0) + 1
    for r in runs:  # two runs alike in every parameter: told apart by their ids
        if seen[r["label"]] > 1 and r["label"] != r["job"]:
            r["label"] += f" ({r['job']})"
    return {"runs": runs, "params": differ, "total": len(juids)}
