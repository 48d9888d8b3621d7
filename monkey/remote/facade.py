"""``RemoteMonkey``: the ``Monkey`` facade's methods, carried out by a main node.

The shell's commands call it as they call ``monkey.api.Monkey`` and get the same types
back (see ``codec``). It implements the contract (``monkey.contract.ServerApi``, checked by
mypy): each forwarded method is one line; a command that needs a method it lacks is refused
by the CLI before it runs (see ``monkey.shell.routing``)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

from monkey.remote import RemoteError, Unreachable, settings
from monkey.remote.client import Client

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.contract import ServerApi
    from monkey.handles import Job
    from monkey.models import Job as JobRecord
    from monkey.models import State
    from monkey.remote.submit import Gatherer

    def _conforms(remote: RemoteMonkey) -> ServerApi:
        return remote  # mypy checks that RemoteMonkey implements the whole contract


# seconds the server waits for the core to create or delete an instance (an answer comes
# within the client's read timeout; the core goes on with a request still under way)
INSTANCE_WAIT = 100.0
PROVIDER_ADD_WAIT = 330.0  # seconds for `provider add`'s answer (the server stops it at 300)
RESUME_FOR = 300.0  # seconds a follow keeps trying to reach the server again
FOLLOW_SILENCE = 15.0  # seconds without a byte (keep-alives come every second): the link is down
_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)
POLL_SILENCE = 15.0  # seconds a poll waits for its answer: a link down is noticed then


class Link:
    """A remote's link as a follower or a poller sees it: one line when it is lost, one when
    it is back, waits growing between tries, and Unreachable (one line) past RESUME_FOR."""

    def __init__(self, remote: RemoteMonkey, juid: str, doing: str, again: str) -> None:
        self.remote, self.juid, self.doing, self.again = remote, juid, doing, again
        self.lost_at: float | None = None
        self.tries = 0

    def up(self) -> None:
        """A call went through."""
        if self.lost_at is not None:
            print(f"monkey: {self.remote.name}: reconnected; {self.doing} again", file=sys.stderr)
        self.lost_at, self.tries = None, 0

    def down(self, most: float | None = None) -> None:
        """A call did not go through: wait before the next (at most MOST seconds)."""
        self.remote.close()
        now = time.monotonic()
        if self.lost_at is None:
            self.lost_at = now
            print(
                f"monkey: {self.remote.name}: connection lost; reconnecting "
                f"(job {self.juid} goes on)",
                file=sys.stderr,
            )
        elif now - self.lost_at > RESUME_FOR:
            raise Unreachable(
                f"{self.remote.name}: cannot reach {self.remote.remote.url} for "
                f"{RESUME_FOR:.0f}s; stopped {self.doing} (job {self.juid} goes on): {self.again}"
            ) from None
        pause = _BACKOFF[min(self.tries, len(_BACKOFF) - 1)]
        time.sleep(pause if most is None else max(0.0, min(pause, most)))
        self.tries += 1


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
        self._gatherer: Gatherer | None = None
        self._ended: dict[str, JobRecord] = {}  # a followed job's end, read by its follow

    def __repr__(self) -> str:
        return f"<RemoteMonkey {self.name} {self.remote.url}>"

    @property
    def providers(self) -> dict[str, Any]:
        """As ``Monkey.providers``: the main node's providers.yml (secrets redacted)."""
        from monkey.config import ProviderConfig

        configs = self.provider_configs()
        return {name: ProviderConfig(name, kind, opts) for name, (kind, opts) in configs.items()}

    def start_core(self) -> int:
        """Never a core on this machine: the main node's server runs its core."""
        raise RemoteError(
            f"{self.name}: the main node's core is run by its server; if it is down, restart "
            "the server there: monkey server stop; monkey server start"
        )

    def close(self) -> None:
        self.client.close()
        if self._gatherer is not None:
            self._gatherer.close()
            self._gatherer = None

    # -- submitting (see monkey.remote.submit) --------------------------------------------

    def gatherer(self) -> Gatherer:
        """What gathers and uploads this remote's submissions (its blob cache opened once)."""
        if self._gatherer is None:
            from monkey.remote.submit import Gatherer

            self._gatherer = Gatherer(self.name, self.client)
        return self._gatherer

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        provider: str = "local",
        name: str | None = None,
        sweep: str | None = None,
        params: dict[str, Any] | None = None,
        start_core: bool = True,
        after: str | Sequence[str] | None = None,
        after_any: str | Sequence[str] | None = None,
        priority: int = 0,
        notify: str | Sequence[str] | None = None,
        image: str | None = None,
        **options: Any,
    ) -> Job:
        """As ``Monkey.run``: the code and data gathered here, the job recorded and run by
        the main node's core (START_CORE does not apply: that core always runs); the image
        (IMAGE, or the job.yml's) is pinned there, with the main node's registry logins."""
        from monkey.remote.submit import LOCAL_OPTIONS, RESOURCES
        from monkey.submit import parse_command

        unknown = sorted(set(options) - {*LOCAL_OPTIONS, *RESOURCES})
        if unknown:
            raise TypeError(f"run() got an unexpected keyword argument {unknown[0]!r}")
        from monkey.handles import Job

        argv = parse_command(cmd)
        g = self.gatherer()
        gathered = g.gather(provider, options)
        juid = g.submit(
            "run",
            argv,
            provider=provider,
            name=name,
            sweep=sweep,
            params=params,
            gathered=gathered,
            **({"after": after} if after else {}),
            **({"after_any": after_any} if after_any else {}),
            **({"priority": priority} if priority else {}),
            **({"notify": notify} if notify else {}),
            **({"image": image or g.image} if image or g.image else {}),
            **{k: options[k] for k in RESOURCES if k in options},
        )
        return Job(self, juid)  # type: ignore[arg-type]  # Owner's methods, remotely

    def sweep(
        self,
        command: str | list[str] | None = None,
        *,
        file: str | dict[str, Any] | None = None,
        provider: str = "local",
        **options: Any,
    ) -> str:
        """As ``Monkey.sweep``: a sweep file is read here and the code and data gathered
        here; returns the sweep id."""
        from monkey.remote.submit import LOCAL_OPTIONS, RESOURCES

        if file is not None and not isinstance(file, dict):
            from monkey.tracking.sweepspec import load_file

            file = load_file(file)
        local = {k: options.pop(k) for k in LOCAL_OPTIONS if k != "retries" and k in options}
        resources = {k: options[k] for k in RESOURCES if k in options}
        g = self.gatherer()
        gathered = g.gather(provider, {**local, **resources})
        if g.image and not options.get("image"):  # the job.yml's, pinned by the server
            options["image"] = g.image
        return g.submit(
            "sweep", command, file=file, provider=provider, gathered=gathered, **options
        )

    def files(self, ref: str) -> list[Any]:
        """As ``Monkey.files``: the job's code files, read from its file list (fetched)."""
        return self._reruns().files(ref)

    def cat(self, ref: str, path: str) -> bytes:
        """As ``Monkey.cat``: one code file as the job saw it (fetched and checked)."""
        return self._reruns().cat(ref, path)

    def clone(self, ref: str, to: Any = None, with_data: bool = False) -> dict[str, Any]:
        """As ``Monkey.clone``: the job's code written here, its blobs fetched and checked;
        with its git history when it was submitted from this machine's repository."""
        return self._reruns().clone(ref, to, with_data=with_data)

    def _reruns(self) -> Any:
        from monkey.remote.reruns import RemoteReruns

        return RemoteReruns(self.gatherer(), self.client, self.get_job, self.info)

    def persisted(self, ref: str) -> list[tuple[str, Path]]:
        """As ``Monkey.persisted``: the job's saved persisted folders, fetched from the main
        node into a folder of this remote's cache removed when this process ends."""
        import atexit
        import shutil
        import tempfile

        from monkey.remote.submit import cache_folder

        juid = self.resolve(ref)
        spec = self.info(juid)["spec"] or {}
        resp = self.client.stream(f"/api/v1/persisted/{quote(juid)}", {})
        cache_folder(self.name).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".pull-", dir=cache_folder(self.name)))
        atexit.register(shutil.rmtree, tmp, True)
        try:
            _extract(resp, tmp)
        except OSError as exc:
            self.close()
            raise Unreachable(
                f"{self.name}: the connection dropped while fetching job {juid}'s folders "
                f"({exc}); run the command again"
            ) from None
        return [
            (p["path"], tmp / p["path"])
            for p in spec.get("persist", [])
            if (tmp / p["path"]).is_dir()
        ]

    def wait_job(self, juid: str, timeout: float | None = None, poll: float = 1.0) -> State:
        """``Job.wait()`` of job JUID: until it ends (a retry pending is not an end) or is
        paused; its state. The server is asked every POLL seconds; while it cannot be
        reached (it restarts, the link is down) the asks back off, one line saying so and
        one when it is back, up to RESUME_FOR seconds (then Unreachable: the job goes on)."""
        from monkey.models import TERMINAL, State

        deadline = None if timeout is None else time.monotonic() + timeout
        link = Link(self, juid, "waiting", f"monkey info {juid}")
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                state = self.client.call_within(POLL_SILENCE, "get_job", juid).state
            except Unreachable:
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"job {juid}: {self.name} out of reach after {timeout}s"
                    ) from None
                link.down(most=left)
                continue
            link.up()
            if state in TERMINAL or state == State.PAUSED:
                return state
            if left is not None and left < 0:
                raise TimeoutError(f"job {juid} still {state.value} after {timeout}s")
            time.sleep(poll if left is None else max(0.0, min(poll, left)))

    def job(self, ref: str) -> Job:
        """As ``Monkey.job``: a handle on job REF of the main node."""
        from monkey.handles import Job

        return Job(self, self.resolve(ref))  # type: ignore[arg-type]

    def rerun(self, ref: str, **options: Any) -> Job:
        """As ``Monkey.rerun``: the new job is the caller's."""
        from monkey.handles import Job

        return Job(self, self.client.call("rerun", ref, **options))  # type: ignore[arg-type]

    # -- forwarded as they are (see monkey.contract) ---------------------------------------

    def rerun_sweep(self, ref: str, **options: Any) -> str:
        return self.client.call("rerun_sweep", ref, **options)

    def provider_kind(
        self,
        provider: str = "local",
        cpus: int = 1,
        gpus: int = 0,
        memory: str | None = None,
        host: str | None = None,
        time: str | int | None = None,
    ) -> str:
        return self.client.call("provider_kind", provider, cpus, gpus, memory, host, time)

    def resolve(self, ref: str) -> str:
        return self.client.call("resolve", ref)

    def get_job(self, ref: str) -> JobRecord:
        ended = self._ended.pop(ref, None)  # read by a follow that saw the job end
        return ended if ended is not None else self.client.call("get_job", ref)

    def info(self, ref: str) -> dict[str, Any]:
        return self.client.call("info", ref)

    def jobs(
        self, state: Any = None, provider: str | None = None, limit: int | None = None
    ) -> list[JobRecord]:
        return self.client.call("jobs", state, provider, limit)

    def jobs_changed(self, since: float) -> list[JobRecord]:
        return self.client.call("jobs_changed", since)

    def search(self, text: str, limit: int = 50) -> list[dict[str, Any]]:
        return self.client.call("search", text, limit)

    def costs(self, juids: list[str], now: float | None = None) -> dict[str, Any]:
        return self.client.call("costs", juids, now)

    def job_owners(self, juids: list[str]) -> dict[str, str | None]:
        return self.client.call("job_owners", juids)

    def live_attempts(self) -> list[dict[str, Any]]:
        return self.client.call("live_attempts")

    def core_status(self) -> int | None:
        return self.client.call("core_status")

    def cancel(self, ref: str) -> State:
        return self.client.call("cancel", ref)

    def pause(self, ref: str) -> State:
        return self.client.call("pause", ref)

    def resume(self, ref: str) -> State:
        return self.client.call("resume", ref)

    def retry(self, ref: str) -> State:
        return self.client.call("retry", ref)

    def set_priority(self, ref: str, priority: int) -> int:
        return self.client.call("set_priority", ref, priority)

    def checkpoints(self, ref: str) -> dict[str, Any]:
        return self.client.call("checkpoints", ref)

    def note(self, ref: str, text: str | None) -> dict[str, Any]:
        return self.client.call("note", ref, text)

    def tag(
        self, ref: str, add: list[str] | None = None, remove: list[str] | None = None
    ) -> dict[str, Any]:
        return self.client.call("tag", ref, add, remove)

    def sweep_note(self, ref: str, text: str | None) -> dict[str, Any]:
        return self.client.call("sweep_note", ref, text)

    def sweep_tag(
        self, ref: str, add: list[str] | None = None, remove: list[str] | None = None
    ) -> dict[str, Any]:
        return self.client.call("sweep_tag", ref, add, remove)

    def sweeps(self, state: str | None = None) -> list[dict[str, Any]]:
        return self.client.call("sweeps", state)

    def sweep_status(self, ref: str) -> dict[str, Any]:
        return self.client.call("sweep_status", ref)

    def sweep_analysis(self, ref: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.client.call("sweep_analysis", ref)  # the server reads the status itself

    def sweep_control(self, ref: str, action: str) -> dict[str, Any]:
        return self.client.call("sweep_control", ref, action)

    def metrics(self, ref: str, name: str | None = None) -> dict[str, Any]:
        return self.client.call("metrics", ref, name)

    def metric_names(self, ref: str) -> list[str]:
        return self.client.call("metric_names", ref)

    def latest_metrics(self, refs: list[str]) -> dict[str, dict[str, float | None]]:
        return self.client.call("latest_metrics", refs)

    def compare(self, refs: list[str] | None = None, **options: Any) -> dict[str, Any]:
        return self.client.call("compare", refs, **options)

    def diff(self, ref_a: str, ref_b: str) -> dict[str, Any]:
        return self.client.call("diff", ref_a, ref_b)

    def select_jobs(
        self, refs: list[str], name: str | None = None, since: str | None = None
    ) -> tuple[list[str], str]:
        return tuple(self.client.call("select_jobs", refs, name, since))

    def plot_data(
        self, refs: list[str], metrics: list[str] | str | None, x: str = "step", **options: Any
    ) -> dict[str, Any]:
        return self.client.call("plot_data", refs, metrics, x, **options)

    def report_data(
        self, ref: str | None, jobs: list[str] | None = None, title: str | None = None
    ) -> dict[str, Any]:
        return self.client.call("report_data", ref, jobs, title)

    def export_jobs(self, refs: list[str] | None = None, sweep: str | None = None) -> list[str]:
        return self.client.call("export_jobs", refs, sweep)

    def export_rows(self, juids: list[str]) -> list[tuple[str, dict[str, Any]]]:
        return self.client.call("export_rows", juids)

    def rm_select(
        self,
        refs: list[str] | None = None,
        sweep: str | None = None,
        older_than: str | None = None,
        failed: bool = False,
        owner: str | None = None,
    ) -> list[JobRecord]:
        return self.client.call("rm_select", refs, sweep, older_than, failed, owner)

    def rm(self, refs: list[str]) -> dict[str, Any]:
        return self.client.call("rm", refs)

    def du(self) -> dict[str, Any]:
        return self.client.call("du")

    def du_hosts(self) -> dict[str, Any]:
        return self.client.call("du_hosts")

    def gc(self, grace: float = 3600.0, image_keep: float = 7 * 86400.0) -> dict[str, Any]:
        return self.client.call("gc", grace, image_keep)

    def verify(self, refs: list[str] | None = None) -> dict[str, Any]:
        return self.client.call("verify", refs)

    def provider_status(self) -> dict[str, Any]:
        return self.client.call("provider_status")

    def check_provider(self, name: str) -> list[dict[str, Any]]:
        return self.client.call("check_provider", name)

    def instances(self) -> list[dict[str, Any]]:
        return self.client.call("instances")

    def monkey_instances(
        self, now: float | None = None, ended: bool = False, pods: bool = False
    ) -> list[Any]:
        return self.client.call("monkey_instances", now, ended, pods)

    def quotas(self) -> list[dict[str, Any]]:
        return self.client.call("quotas")

    def set_quota(
        self,
        user: str | None,
        provider: str | None = None,
        jobs: int | str | None = None,
        gpus: int | str | None = None,
        spend: float | str | None = None,
        share: float | str | None = None,
        storage: int | str | None = None,
    ) -> dict[str, Any]:
        return self.client.call("set_quota", user, provider, jobs, gpus, spend, share, storage)

    def remove_quota(self, user: str | None, provider: str | None = None) -> None:
        return self.client.call("remove_quota", user, provider)

    def notify_add(self, name: str, kind: str, dest: str, **options: Any) -> dict[str, Any]:
        return self.client.call("notify_add", name, kind, dest, **options)

    def notify_list(self) -> list[dict[str, Any]]:
        return self.client.call("notify_list")

    def notify_remove(self, name: str) -> None:
        return self.client.call("notify_remove", name)

    def notify_test(self, name: str) -> None:
        return self.client.call("notify_test", name)

    def notify_allow(self, cidr: str | None = None, remove: bool = False) -> list[str]:
        return self.client.call("notify_allow", cidr, remove)

    def whoami(self) -> dict[str, Any]:
        return self.client.call("whoami")

    def provider_configs(self) -> dict[str, list[Any]]:
        return self.client.call("provider_configs")

    def dashboard_state(
        self, now: float | None = None, owners_of: list[str] | None = None
    ) -> dict[str, Any]:
        return self.client.call("dashboard_state", now, owners_of)

    def web_link(self, page: str = "/web/jobs") -> str:
        return self.client.call("web_link", page)

    def job_listing(
        self,
        states: Any = None,
        provider: str | None = None,
        limit: int | None = None,
        owners: bool = True,
        owner: str | None = None,
        mine: bool = False,
        tag: str | None = None,
    ) -> dict[str, Any]:
        """What `monkey list jobs` shows; with the owners when the server has several users;
        only OWNER's jobs, or with MINE this token's user's; only those tagged TAG."""
        return self.client.call(
            "job_listing",
            None if states is None else sorted(s.value for s in states),
            provider,
            limit,
            **({"owner": owner} if owner is not None else {}),
            **({"mine": True} if mine else {}),
            **({"tag": tag} if tag is not None else {}),
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

    def provider_add(self, words: list[str], name: str) -> dict[str, Any]:
        """`monkey provider add WORDS` run by the main node as its own command (admins): its
        "code", "stdout" and "stderr". NAME, the provider, names it in the server's log."""
        return self.client.call_within(PROVIDER_ADD_WAIT, "provider_add", words, name)

    def output_chunks(
        self,
        ref: str,
        stream: str = "both",
        attempt: int | None = None,
        tail: int | None = None,
        setup: bool = False,
        marks: bool = True,
    ) -> Iterator[bytes]:
        """What the job printed so far (as ``Monkey.output_chunks``), streamed."""
        resp = self.client.stream(
            f"/api/v1/logs/{quote(ref)}",
            {
                "stream": stream,
                "attempt": attempt,
                "tail": tail,
                "setup": int(setup) if setup else None,
                "unmarked": None if marks else 1,
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

    def logs(
        self, ref: str, stderr: bool = False, attempt: int | None = None, tail: int | None = None
    ) -> bytes:
        """As ``Monkey.logs``: the job's stdout (or STDERR) so far, or its last TAIL lines."""
        chunks = self.output_chunks(
            ref, "stderr" if stderr else "stdout", attempt=attempt, tail=tail, marks=False
        )
        return b"".join(chunks)

    def follow(
        self,
        ref: str,
        stderr: bool = False,
        tail: int | None = None,
        poll: float = 1.0,
        stream: str | None = None,
        files: bool = False,
    ) -> Iterator[Any]:
        """The job's output as it is written until the job ends (as ``Monkey.follow``). A
        dropped connection or a restarted server is waited for (back-off, up to RESUME_FOR
        seconds) and the output resumes from the last byte yielded: none lost or doubled.
        With FILES, as ``Monkey.follow_pieces``: (file, offset, piece), ("mark", N, line),
        None each second nothing is written (a reader can stop then)."""
        stream = stream or ("stderr" if stderr else "stdout")
        juid = self.resolve(ref)
        start: dict[str, Any] = {"offsets": {}, "marked": []}
        first, link = True, Link(self, juid, "following", f"monkey logs -f {juid}")
        while True:
            try:
                query = {"stream": stream, "follow": 1, "tail": tail if first else None}
                resp = self.client.stream(
                    f"/api/v1/logs/{quote(juid)}",
                    query,
                    body=None if first else start,
                    read_timeout=FOLLOW_SILENCE,
                )
                link.up()
                first = False
                if (yield from _frames(resp, start, files)):
                    break
                raise Unreachable("the stream ended early")
            except Unreachable:
                link.down()
        while True:  # its end as recorded, for the exit status: a server stopping meanwhile
            try:  # is waited for as the stream was (then `get_job` answers from here)
                self._ended[juid] = self.client.call("get_job", juid)
                link.up()
                return
            except Unreachable:
                link.down()


def _extract(stream: Any, dest: Path) -> None:
    """Unpack the tar archive read from STREAM into DEST: only files, folders and links
    that stay inside DEST (the `data` filter; on a Python without it, the same rules)."""
    import tarfile

    with tarfile.open(fileobj=stream, mode="r|") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        for member in tar:
            name = member.name
            if (
                name.startswith("/")
                or ".." in name.split("/")
                or not (member.isfile() or member.isdir())
            ):
                raise RemoteError(f"the server sent an unsafe path {name!r}; refused")
            tar.extract(member, dest)


def _frames(resp: Any, start: dict[str, Any], files: bool = False) -> Generator[Any, None, bool]:
    """Yield the pieces of a follow stream, recording in START where each ended (only once
    it is whole); True when the server said the job ended, False when the stream broke.
    With FILES, as ``RemoteMonkey.follow`` says."""
    try:
        while True:
            head = resp.readline()
            if not head.endswith(b"\n"):
                return False
            kind, *fields = head.decode().split()
            if kind == "K":
                if files:
                    yield None
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
                piece: Any = ("mark", int(fields[0]), body)
            else:  # D FILE OFFSET SIZE
                start["offsets"][fields[0]] = int(fields[1]) + size
                piece = (fields[0], int(fields[1]), body)
            yield piece if files else body
    except (OSError, ValueError, IndexError):  # wire.BadAnswer is an OSError
        return False
