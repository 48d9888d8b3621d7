"""``RemoteMonkey``: the ``Monkey`` facade's methods, carried out by a main node.

The shell's commands call it as they call ``monkey.api.Monkey`` and get the same types
back (see ``codec``). Methods not listed in ``CALLS`` do not exist here: a command that
needs one is refused by the CLI before it runs (see ``monkey.shell.common.REMOTE_READY``)."""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections.abc import Generator, Iterator
from urllib.parse import quote

from monkey.remote import settings
from monkey.remote.client import Client, RemoteError, Unreachable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Facade methods called as they are: name -> whether they act on a job (the server checks
# its owner). The server's allow-list (monkey.server.calls) is the authority.
CALLS = (
    "resolve",
    "get_job",
    "info",
    "provider_status",
    "monkey_instances",
    "cancel",
    "pause",
    "resume",
    "retry",
    "metrics",
    "search",
    "whoami",
    "sweeps",
    "sweep_status",
    "sweep_analysis",
    "sweep_control",
    "costs",
    "compare",
    "diff",
    "select_jobs",
    "plot_data",
    "report_data",
    "export_jobs",
    "export_rows",
    "rm_select",
    "rm",
    "du",
    "du_hosts",
    "gc",
    "verify",
    "instances",
    "check_provider",
)
# seconds the server waits for the core to create or delete an instance (an answer comes
# within the client's read timeout; the core goes on with a request still under way)
INSTANCE_WAIT = 100.0
RESUME_FOR = 300.0  # seconds a follow keeps trying to reach the server again
FOLLOW_SILENCE = 15.0  # seconds without a byte (keep-alives come every second): the link is down
_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)


class RemoteMonkey:
    """The facade of the main node NAME (default: the selected remote)."""

    def __init__(self, name: str | None = None) -> None:
        name = name or settings.selected()
        if name is None:
            raise RemoteError(
                "no remote selected; add one with `monkey remote add NAME URL --token T`"
            )
        self.name = name
        self.remote = settings.get(name)
        self.client = Client(self.remote, settings.load()["remotes"][name].get("user"))

    def __repr__(self) -> str:
        return f"<RemoteMonkey {self.name} {self.remote.url}>"

    def __getattr__(self, method: str) -> Any:
        if method not in CALLS:
            raise AttributeError(f"{method!r} is not available through a remote yet")
        return lambda *args, **kwargs: self.client.call(method, *args, **kwargs)

    def close(self) -> None:
        self.client.close()

    def job_listing(
        self,
        states: Any = None,
        provider: str | None = None,
        limit: int | None = None,
        owners: bool = True,
        owner: str | None = None,
        mine: bool = False,
    ) -> dict[str, Any]:
        """What `monkey list jobs` shows; with the owners when the server has several users;
        only OWNER's jobs, or with MINE this token's user's."""
        return self.client.call(
            "job_listing",
            None if states is None else sorted(s.value for s in states),
            provider,
            limit,
            **({"owner": owner} if owner is not None else {}),
            **({"mine": True} if mine else {}),
        )

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
        """As ``Monkey.plot``: the data from the server, the file drawn and written here."""
        from monkey.facade import render

        return render.plot(self.plot_data, refs, metrics, out, x, size, smooth, log_y, sweep)

    def report(
        self, ref: str | None, out: str, jobs: list[str] | None = None, title: str | None = None
    ) -> str:
        """As ``Monkey.report``: the data from the server, the HTML rendered and written here."""
        from monkey.facade import render

        return render.report(self.report_data, ref, out, jobs, title)

    def export(
        self,
        refs: list[str] | None = None,
        *,
        sweep: str | None = None,
        to: str | None = None,
        csv_dir: str | None = None,
    ) -> dict[str, int]:
        """As ``Monkey.export``: the rows from the server, the files written here."""
        from monkey.facade.export import export

        return export(None, self.export_jobs(refs, sweep), to, csv_dir, fetch=self.export_rows)

    def create_instance(
        self,
        provider: str,
        size: str | None = None,
        spot: bool | None = None,
        host: str | None = None,
        timeout: float = INSTANCE_WAIT,
    ) -> dict[str, Any]:
        """As ``Monkey.create_instance`` (admins), waiting at most INSTANCE_WAIT seconds."""
        return self.client.call(
            "create_instance", provider, size, spot, host, min(timeout, INSTANCE_WAIT)
        )

    def delete_instance(
        self, ref: str, force: bool = False, timeout: float = INSTANCE_WAIT
    ) -> dict[str, Any]:
        """As ``Monkey.delete_instance`` (admins), waiting at most INSTANCE_WAIT seconds."""
        return self.client.call("delete_instance", ref, force, min(timeout, INSTANCE_WAIT))

    def output_chunks(
        self,
        ref: str,
        stream: str = "both",
        attempt: int | None = None,
        tail: int | None = None,
        setup: bool = False,
    ) -> Iterator[bytes]:
        """What the job printed so far (as ``Monkey.output_chunks``), streamed."""
        resp = self.client.stream(
            f"/api/v1/logs/{quote(ref)}",
            {
                "stream": stream,
                "attempt": attempt,
                "tail": tail,
                "setup": int(setup) if setup else None,
            },
        )
        while True:
            try:
                piece = resp.read1(1 << 16)
            except OSError as exc:
                self.close()
                raise Unreachable(
                    f"{self.name}: the connection dropped while reading the log "
                    f"({exc}); run the command again"
                ) from None
            if not piece:
                return
            yield piece

    def follow(
        self,
        ref: str,
        stderr: bool = False,
        tail: int | None = None,
        poll: float = 1.0,
        stream: str | None = None,
    ) -> Iterator[bytes]:
        """The job's output as it is written until the job ends (as ``Monkey.follow``). A
        dropped connection or a restarted server is waited for (back-off, up to RESUME_FOR
        seconds) and the output resumes from the last byte yielded: none lost or doubled."""
        stream = stream or ("stderr" if stderr else "stdout")
        juid = self.resolve(ref)
        start: dict[str, Any] = {"offsets": {}, "marked": []}
        first, lost_at, tries = True, None, 0
        while True:
            try:
                query = {"stream": stream, "follow": 1, "tail": tail if first else None}
                resp = self.client.stream(
                    f"/api/v1/logs/{quote(juid)}",
                    query,
                    body=None if first else start,
                    read_timeout=FOLLOW_SILENCE,
                )
                if lost_at is not None:
                    print(f"monkey: {self.name}: reconnected; following again", file=sys.stderr)
                lost_at, tries, first = None, 0, False
                if (yield from _frames(resp, start)):
                    return
                raise Unreachable("the stream ended early")
            except Unreachable:
                self.close()
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    print(
                        f"monkey: {self.name}: connection lost; reconnecting (job {juid} goes on)",
                        file=sys.stderr,
                    )
                elif now - lost_at > RESUME_FOR:
                    raise Unreachable(
                        f"{self.name}: cannot reach {self.remote.url} for "
                        f"{RESUME_FOR:.0f}s; stopped following (job {juid} goes on): "
                        f"monkey logs -f {juid}"
                    ) from None
                time.sleep(_BACKOFF[min(tries, len(_BACKOFF) - 1)])
                tries += 1


def _frames(resp: Any, start: dict[str, Any]) -> Generator[bytes, None, bool]:
    """Yield the pieces of a follow stream, recording in START where each ended (only once
    it is whole); True when the server said the job ended, False when the stream broke."""
    try:
        while True:
            head = resp.readline()
            if not head.endswith(b"\n"):
                return False
            kind, *fields = head.decode().split()
            if kind == "K":
                continue
            if kind == "E":
                resp.read()  # the stream's end: the connection serves the next call
                return True
            size = int(fields[-1])
            body = resp.read(size)
            if len(body) != size:
                return False
            if kind == "X":
                raise RemoteError(body.decode(errors="replace"))
            if kind == "C":  # where the server began (after a tail): kept for a resume
                begin = json.loads(body)
                start["offsets"].update(begin["offsets"])
                start["marked"] = sorted(set(start["marked"]) | set(begin["marked"]))
                continue
            if kind == "M":
                start["marked"].append(int(fields[0]))
            else:  # D FILE OFFSET SIZE
                start["offsets"][fields[0]] = int(fields[1]) + size
            yield body
    except (OSError, ValueError, IndexError, http.client.HTTPException):
        return False
