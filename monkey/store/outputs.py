"""Store queries of `run --outputs` and `run --image`, and of what a job's start needs
beside its row."""

from __future__ import annotations

import json
import sqlite3

from monkey.models import Job
from monkey.store.jobspec import read_spec
from monkey.store.rows import _JOB_COLUMNS, _job

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class StartFacts:
    """What the core's start of a job reads beside its row (``OutputQueries.start_facts``)."""

    __slots__ = ("secrets", "owner", "spec", "image", "outputs", "users")

    def __init__(
        self,
        secrets: str | None,
        owner: str | None,
        spec: dict[str, Any] | None,
        image: dict[str, str] | None,
        outputs: list[str],
        users: int,
    ) -> None:
        self.secrets = secrets  # ``Store.secrets_ref``
        self.owner = owner  # who submitted it (None: not recorded)
        self.spec = spec  # ``JobSpecStore.job_spec``
        self.image = image  # ``job_image``
        self.outputs = outputs  # ``outputs``
        self.users = users  # ``UserStore.count_users``


class OutputQueries:
    """Mixin of Store: output globs (``job_outputs``) and images (``job_images``) of jobs."""

    db: sqlite3.Connection

    def outputs(self, juid: str) -> list[str]:
        """The globs of files to fetch back when the job ends (relative to its folder)."""
        row = self.db.execute("SELECT globs FROM job_outputs WHERE juid = ?", (juid,)).fetchone()
        return json.loads(row[0]) if row else []

    def job_with_outputs(self, juid: str) -> tuple[Job | None, list[str]]:
        """(``get_job``, ``outputs``) of JUID in one statement: what an exit reads."""
        row = self.db.execute(
            f"SELECT {_JOB_COLUMNS}, o.globs FROM jobs LEFT JOIN job_outputs o USING (juid) "
            "WHERE jobs.juid = ?",
            (juid,),
        ).fetchone()
        if row is None:
            return None, []
        return _job(row[:-1]), json.loads(row[-1]) if row[-1] else []

    def job_image(self, juid: str) -> dict[str, str] | None:
        """The image the job runs in, {"ref", "digest"}; None when it has none."""
        row = self.db.execute("SELECT image FROM job_images WHERE juid = ?", (juid,)).fetchone()
        return None if row is None else _image(row[0])

    def start_facts(self, juid: str) -> StartFacts | None:
        """What a start of JUID needs beside its row, in one statement (a start read six
        before); None when the job is gone."""
        row = self.db.execute(
            "SELECT j.secrets, j.owner, s.spec, i.image, o.globs, (SELECT COUNT(*) FROM users) "
            "FROM jobs j LEFT JOIN job_specs s ON s.juid = j.juid "
            "LEFT JOIN job_images i ON i.juid = j.juid "
            "LEFT JOIN job_outputs o ON o.juid = j.juid WHERE j.juid = ?",
            (juid,),
        ).fetchone()
        if row is None:
            return None
        secrets, owner, spec, image, globs, users = row
        return StartFacts(
            secrets,
            owner,
            None if spec is None else read_spec(spec),
            None if image is None else _image(image),
            json.loads(globs) if globs else [],
            users,
        )


def _image(text: str) -> dict[str, str] | None:
    """A job_images row's image, None when it is not a JSON object."""
    try:
        image = json.loads(text)
    except ValueError:
        return None
    return image if isinstance(image, dict) else None
