"""What the job page shows beyond its first step (issue 28): its datasets, persisted
folders and outputs (``files.data_part``), the rerun form and the clone instructions."""

from __future__ import annotations

from monkey.server.web.files import data_part
from monkey.server.web.rerun_form import form_values

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey


def extras(m: Monkey, info: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """The job page's further values, from ``Monkey.info``'s INFO, for USER."""
    return {"data": data_part(m, info["job"]), "rerun": form_values(m, info, user)}
