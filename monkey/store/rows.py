"""Rows of jobs and attempts turned into models: the columns every job and attempt query
selects, and their decoding."""

from __future__ import annotations

import json

from monkey.models import Attempt, Job, Resources, State
from monkey.store.deps import WAITING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_JOB_COLUMNS = (
    "juid, name, state, argv, provider, resources, env, snapshot, workdir, datasets, git, "
    "python, retries, attempts, request, exit_code, reason, created_at, updated_at, "
    "started_at, finished_at, not_before, sweep, params, instance, unreachable_since, priority, "
    f"held, state = 'queued' AND {WAITING}, phase"
)
_ATTEMPT_COLUMNS = (
    "juid, n, instance, state, started_at, ended_at, exit_code, signal, reason, pid, "
    "run_dir, heartbeat_at, events_offset, gpus, size, spot, price"
)


def _decode(text: str) -> Any:
    """A JSON column's value; the empty object and list (most jobs' env, git, datasets and
    params) without the parser."""
    if text == "{}":
        return {}
    if text == "[]":
        return []
    return json.loads(text)


def _job(row: tuple[Any, ...]) -> Job:
    (
        juid,
        name,
        state,
        argv,
        provider,
        resources,
        env,
        snapshot,
        workdir,
        datasets,
        git,
        python,
        retries,
        attempts,
        request,
        exit_code,
        reason,
        created_at,
        updated_at,
        started_at,
        finished_at,
        not_before,
        sweep,
        params,
        instance,
        unreachable_since,
        priority,
        held,
        waiting,
        phase,
    ) = row
    return Job(
        juid=juid,
        name=name,
        state=State(state),
        argv=json.loads(argv),
        provider=provider,
        resources=Resources(**json.loads(resources)),
        env=_decode(env),
        snapshot=snapshot,
        workdir=workdir,
        datasets=_decode(datasets),
        git=_decode(git),
        python=python,
        retries=retries,
        attempts=attempts,
        request=request,
        exit_code=exit_code,
        reason=reason,
        created_at=created_at,
        updated_at=updated_at,
        started_at=started_at,
        finished_at=finished_at,
        not_before=not_before,
        sweep=sweep,
        params=_decode(params),
        instance=instance,
        unreachable_since=unreachable_since,
        priority=priority,
        held=held,
        waiting=bool(waiting),
        phase=phase,
    )


def _attempt(row: tuple[Any, ...]) -> Attempt:
    att = Attempt(*row)
    att.spot = bool(att.spot)
    return att
