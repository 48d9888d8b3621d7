"""The API's contract: each facade method declared once, typed, with who may call it through
a main node and how it crosses a remote.

``Api`` is what ``monkey.api.Monkey`` (this machine) and ``monkey.remote.facade.RemoteMonkey``
(a main node) both implement; mypy checks both against it. ``ServerApi`` adds the calls only
a main node answers. The server's routes (``POST /api/v1/call/METHOD``), the validation of
their arguments (monkey.server.door), the OpenAPI document and the shell's remote routing are
all derived from the rules here (``methods()``). The parameter types of a forwarded method
are what crosses the wire: JSON types that the server checks strictly on arrival.

Cheap to import (every one-shot command's routing does): no `typing` at run time, and
no validation library (the server's door has it)."""

from __future__ import annotations

import enum

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Sequence
    from pathlib import Path
    from typing import Any, Protocol, TypeVar

    from monkey.handles import Job
    from monkey.models import Job as JobRecord
    from monkey.models import State
    from monkey.snapshot.manifest import FileEntry

    _F = TypeVar("_F", bound=Callable[..., Any])
else:
    Protocol = object  # typing costs a one-shot command's start; only mypy needs it


class Access(enum.Enum):
    """Who may make a call through a main node."""

    ANYONE = "any user"
    CALLER = "any user, on what is their own (the caller is passed)"
    JOB = "the owner of the job named by `ref`, or an admin"
    SWEEP = "the owner of every job of the sweep named by `ref`, or an admin"
    JOBS = "the owner of each job listed by `refs`, or an admin"
    SUBMITS = "any user; what it records is the caller's"
    ADMIN = "admins of the server"


class Crossing(enum.Enum):
    """How a method crosses a remote."""

    FORWARDED = "sent as it is to POST /api/v1/call/METHOD"
    GATHERED = "code and data gathered on the client, then sent as the `Wire` form"
    STREAMED = "read from a stream route of its own (/api/v1/logs, /api/v1/persisted)"
    CLIENT = "made on the client from forwarded calls (files written there)"
    LOCAL = "this machine only: refused through a remote"


class Rule:
    """A method's place in the contract. SERVED: the server answers it with its own
    implementation (``monkey.server.calls.SERVED``), given the caller."""

    __slots__ = ("access", "crossing", "served")

    def __init__(self, access: Access, crossing: Crossing, served: bool = False) -> None:
        self.access, self.crossing, self.served = access, crossing, served

    def __repr__(self) -> str:
        return f"Rule({self.access.name}, {self.crossing.name}, served={self.served})"

    @property
    def called(self) -> bool:
        """Whether POST /api/v1/call/METHOD serves it."""
        return self.crossing in (Crossing.FORWARDED, Crossing.GATHERED)


def api(*marks: Access | Crossing, served: bool = False) -> Callable[[_F], _F]:
    """Declare the decorated method's rule: its Access (default anyone) and its Crossing
    (default forwarded)."""
    access = next((m for m in marks if isinstance(m, Access)), Access.ANYONE)
    crossing = next((m for m in marks if isinstance(m, Crossing)), Crossing.FORWARDED)

    def mark(method: _F) -> _F:
        method.__api__ = Rule(access, crossing, served)  # type: ignore[attr-defined]
        return method

    return mark


ANYONE, CALLER, JOB, SWEEP, JOBS, SUBMITS, ADMIN = Access
FORWARDED, GATHERED, STREAMED, CLIENT, LOCAL = Crossing


class Api(Protocol):
    """The facade's methods, as both implementations offer them."""

    # -- submit ---------------------------------------------------------------------------
    @api(SUBMITS, GATHERED, served=True)
    def run(
        self,
        cmd: str | Sequence[str],
        *,
        provider: str = ...,
        name: str | None = ...,
        cpus: int = ...,
        gpus: int = ...,
        memory: str | None = ...,
        host: str | None = ...,
        time: str | int | None = ...,
        image: str | None = ...,
        outputs: str | Sequence[str] = ...,
        retries: int = ...,
        datasets: str | Sequence[str] = ...,
        env: dict[str, str] | str | Sequence[str] | None = ...,
        workdir: str | None = ...,
        sweep: str | None = ...,
        params: dict[str, Any] | None = ...,
        start_core: bool = ...,
        job_yml: str | bool | None = ...,
        yes: bool = ...,
        after: str | Sequence[str] | None = ...,
        after_any: str | Sequence[str] | None = ...,
        priority: int = ...,
        notify: str | Sequence[str] | None = ...,
    ) -> Job: ...

    @api(SUBMITS, GATHERED, served=True)
    def sweep(
        self,
        command: str | list[str] | None = ...,
        *,
        grid: dict[str, list[Any]] | None = ...,
        random: int | None = ...,
        distributions: dict[str, dict[str, Any]] | None = ...,
        file: str | dict[str, Any] | None = ...,
        metric: str | None = ...,
        goal: str | None = ...,
        max_parallel: int | None = ...,
        retries: int | None = ...,
        early_terminate: str | dict[str, Any] | None = ...,
        seed: int | None = ...,
        name: str | None = ...,
        max_cells: int | None = ...,
        after: str | Sequence[str] | None = ...,
        after_any: str | Sequence[str] | None = ...,
        priority: int = ...,
        notify: str | Sequence[str] | None = ...,
        provider: str = ...,
    ) -> str: ...

    @api(SUBMITS)
    def rerun(
        self,
        ref: str,
        *,
        set: dict[str, Any] | list[str] | None = ...,
        provider: str | None = ...,
        cpus: int | None = ...,
        gpus: int | None = ...,
        memory: str | None = ...,
        time: str | int | None = ...,
        name: str | None = ...,
        start_core: bool = ...,
        after: str | list[str] | None = ...,
        after_any: str | list[str] | None = ...,
        priority: int = ...,
        notify: str | list[str] | None = ...,
    ) -> Job: ...

    @api(SUBMITS, served=True)  # in place: the sweep's owner's
    def rerun_sweep(
        self,
        ref: str,
        *,
        failed: bool = ...,
        cells: list[int] | None = ...,
        set: dict[str, Any] | list[str] | None = ...,
        in_place: bool = ...,
        provider: str | None = ...,
        cpus: int | None = ...,
        gpus: int | None = ...,
        memory: str | None = ...,
        time: str | int | None = ...,
        name: str | None = ...,
        start_core: bool = ...,
        after: str | list[str] | None = ...,
        after_any: str | list[str] | None = ...,
        priority: int = ...,
    ) -> str: ...

    @api()
    def provider_kind(
        self,
        provider: str = ...,
        cpus: int = ...,
        gpus: int = ...,
        memory: str | None = ...,
        host: str | None = ...,
        time: str | int | None = ...,
    ) -> str: ...

    # -- read -----------------------------------------------------------------------------
    @api()
    def resolve(self, ref: str) -> str: ...
    @api()
    def get_job(self, ref: str) -> JobRecord: ...
    @api()
    def info(self, ref: str) -> dict[str, Any]: ...
    @api(CLIENT)
    def job(self, ref: str) -> Job: ...
    @api()
    def checkpoints(self, ref: str) -> dict[str, Any]: ...

    @api(served=True)  # the owners shown when the server has several users
    def job_listing(
        self,
        states: Collection[str] | None = ...,
        provider: str | None = ...,
        limit: int | None = ...,
        owners: bool = ...,
        owner: str | None = ...,
        mine: bool = ...,
        tag: str | None = ...,
    ) -> dict[str, Any]: ...

    @api()
    def jobs(
        self,
        state: str | list[str] | None = ...,
        provider: str | None = ...,
        limit: int | None = ...,
    ) -> list[JobRecord]: ...
    @api()
    def jobs_changed(self, since: float) -> list[JobRecord]: ...
    @api()
    def search(self, text: str, limit: int = ...) -> list[dict[str, Any]]: ...
    @api()
    def costs(self, juids: list[str], now: float | None = ...) -> dict[str, Any]: ...
    @api()
    def job_owners(self, juids: list[str]) -> dict[str, str | None]: ...
    @api()
    def live_attempts(self) -> list[dict[str, Any]]: ...
    @api()
    def core_status(self) -> int | None: ...
    @api(LOCAL)
    def start_core(self) -> int: ...

    # -- logs and files (streamed, or made on the client) -----------------------------------
    @api(STREAMED)
    def output_chunks(
        self,
        ref: str,
        stream: str = ...,
        attempt: int | None = ...,
        tail: int | None = ...,
        setup: bool = ...,
        marks: bool = ...,
    ) -> Iterator[bytes]: ...

    @api(STREAMED)
    def logs(
        self, ref: str, stderr: bool = ..., attempt: int | None = ..., tail: int | None = ...
    ) -> bytes: ...

    @api(STREAMED)
    def follow(
        self,
        ref: str,
        stderr: bool = ...,
        tail: int | None = ...,
        poll: float = ...,
        stream: str | None = ...,
    ) -> Iterator[bytes]: ...

    @api(STREAMED)
    def persisted(self, ref: str) -> list[tuple[str, Path]]: ...
    @api(CLIENT)
    def files(self, ref: str) -> list[FileEntry]: ...
    @api(CLIENT)
    def cat(self, ref: str, path: str) -> bytes: ...
    @api(CLIENT)
    def clone(self, ref: str, to: str | None = ..., with_data: bool = ...) -> dict[str, Any]: ...

    # -- control --------------------------------------------------------------------------
    @api(JOB)
    def cancel(self, ref: str) -> State: ...
    @api(JOB)
    def pause(self, ref: str) -> State: ...
    @api(JOB)
    def resume(self, ref: str) -> State: ...
    @api(JOB)
    def retry(self, ref: str) -> State: ...
    @api(JOB)
    def set_priority(self, ref: str, priority: int) -> int: ...

    # -- notes and tags (a researcher's own words on a job or sweep) ----------------------
    @api(JOB)
    def note(self, ref: str, text: str | None) -> dict[str, Any]: ...
    @api(JOB)
    def tag(
        self, ref: str, add: list[str] | None = ..., remove: list[str] | None = ...
    ) -> dict[str, Any]: ...
    @api(SWEEP)
    def sweep_note(self, ref: str, text: str | None) -> dict[str, Any]: ...
    @api(SWEEP)
    def sweep_tag(
        self, ref: str, add: list[str] | None = ..., remove: list[str] | None = ...
    ) -> dict[str, Any]: ...

    # -- sweeps, metrics, comparisons -----------------------------------------------------
    @api()
    def sweeps(self, state: str | None = ...) -> list[dict[str, Any]]: ...
    @api()
    def sweep_status(self, ref: str) -> dict[str, Any]: ...
    @api(served=True)  # from the sweep's status as the server reads it
    def sweep_analysis(self, ref: str, status: dict[str, Any] | None = ...) -> dict[str, Any]: ...
    @api(SWEEP)
    def sweep_control(self, ref: str, action: str) -> dict[str, Any]: ...
    @api()
    def metrics(
        self, ref: str, name: str | None = ...
    ) -> dict[str, list[tuple[int | None, float, float]]]: ...
    @api()
    def metric_names(self, ref: str) -> list[str]: ...
    @api()
    def latest_metrics(self, refs: list[str]) -> dict[str, dict[str, float | None]]: ...

    @api()
    def compare(
        self,
        refs: list[str] | None = ...,
        *,
        sweep: str | None = ...,
        sort: str | None = ...,
        reverse: bool = ...,
        system: bool = ...,
    ) -> dict[str, Any]: ...

    @api()
    def diff(self, ref_a: str, ref_b: str) -> dict[str, Any]: ...
    @api()
    def select_jobs(
        self, refs: list[str], name: str | None = ..., since: str | None = ...
    ) -> tuple[list[str], str]: ...

    @api()
    def plot_data(
        self,
        refs: list[str],
        metrics: list[str] | str | None,
        x: str = ...,
        *,
        smooth: float = ...,
        log_y: bool = ...,
        sweep: str | None = ...,
    ) -> dict[str, Any]: ...

    @api(CLIENT)
    def plot(
        self,
        refs: list[str],
        metrics: list[str] | str | None,
        out: str,
        x: str = ...,
        size: tuple[int, int] = ...,
        *,
        smooth: float = ...,
        log_y: bool = ...,
        sweep: str | None = ...,
    ) -> str: ...

    @api()
    def report_data(
        self, ref: str | None, jobs: list[str] | None = ..., title: str | None = ...
    ) -> dict[str, Any]: ...
    @api(CLIENT)
    def report(
        self, ref: str | None, out: str, jobs: list[str] | None = ..., title: str | None = ...
    ) -> str: ...
    @api()
    def export_jobs(self, refs: list[str] | None = ..., sweep: str | None = ...) -> list[str]: ...
    @api()
    def export_rows(self, juids: list[str]) -> list[tuple[str, dict[str, Any]]]: ...

    @api(CLIENT)
    def export(
        self,
        refs: list[str] | None = ...,
        *,
        sweep: str | None = ...,
        to: str | None = ...,
        csv_dir: str | None = ...,
    ) -> dict[str, int]: ...

    # -- disk -----------------------------------------------------------------------------
    @api(served=True)  # a plain user's selection: their own jobs
    def rm_select(
        self,
        refs: list[str] | None = ...,
        sweep: str | None = ...,
        older_than: str | None = ...,
        failed: bool = ...,
        owner: str | None = ...,
    ) -> list[JobRecord]: ...

    @api(JOBS)
    def rm(self, refs: list[str]) -> dict[str, Any]: ...
    @api()
    def du(self) -> dict[str, Any]: ...
    @api()
    def du_hosts(self) -> dict[str, Any]: ...
    @api(ADMIN)
    def gc(self, grace: float = ..., image_keep: float = ...) -> dict[str, Any]: ...
    @api(ADMIN)
    def verify(self, refs: list[str] | None = ...) -> dict[str, Any]: ...

    # -- providers, machines, quotas ------------------------------------------------------
    @api()
    def provider_status(self) -> dict[str, Any]: ...
    @api(ADMIN)  # it records what it finds, as the core would
    def check_provider(self, name: str) -> list[dict[str, Any]]: ...
    @api()
    def instances(self) -> list[dict[str, Any]]: ...
    @api()
    def monkey_instances(
        self, now: float | None = ..., ended: bool = ..., pods: bool = ...
    ) -> list[dict[str, Any]]: ...

    @api(ADMIN)
    def create_instance(
        self,
        provider: str,
        size: str | None = ...,
        spot: bool | None = ...,
        host: str | None = ...,
        timeout: float = ...,
    ) -> dict[str, Any]: ...

    @api(ADMIN)
    def delete_instance(
        self, ref: str, force: bool = ..., timeout: float = ...
    ) -> dict[str, Any]: ...
    @api()
    def quotas(self) -> list[dict[str, Any]]: ...

    @api(ADMIN)
    def set_quota(
        self,
        user: str | None,
        provider: str | None = ...,
        jobs: int | str | None = ...,
        gpus: int | str | None = ...,
        spend: float | str | None = ...,
        share: float | str | None = ...,
        storage: int | str | None = ...,
    ) -> dict[str, Any]: ...

    @api(ADMIN)
    def remove_quota(self, user: str | None, provider: str | None = ...) -> None: ...

    # -- notifications: the caller's own targets (their secrets stay on the server) -------
    @api(CALLER)
    def notify_add(
        self,
        name: str,
        kind: str,
        dest: str,
        *,
        secret: str | None = ...,
        events: str | list[str] | None = ...,
        sweep: str | None = ...,
        glob: str | None = ...,
        smtp: str | None = ...,
        sender: str | None = ...,
        user: str | None = ...,
        password: str | None = ...,
        tls: str = ...,
        check: bool = ...,
        idle_after: str | float | None = ...,
        spend_over: str | float | None = ...,
    ) -> dict[str, Any]: ...

    @api(CALLER)
    def notify_list(self) -> list[dict[str, Any]]: ...
    @api(CALLER)
    def notify_remove(self, name: str) -> None: ...
    @api(CALLER)
    def notify_test(self, name: str) -> None: ...
    @api(ADMIN)  # the ranges plain users' notify targets may reach beyond public addresses
    def notify_allow(self, cidr: str | None = ..., remove: bool = ...) -> list[str]: ...


class ServerApi(Api, Protocol):
    """``Api`` and the calls only a main node answers (each with its own implementation)."""

    @api(CALLER, served=True)
    def whoami(self) -> dict[str, Any]: ...
    @api(served=True)  # providers.yml, secrets redacted
    def provider_configs(self) -> dict[str, list[Any]]: ...
    @api(served=True)  # what the dashboard reads at each poll besides the jobs
    def dashboard_state(
        self, now: float | None = ..., owners_of: list[str] | None = ...
    ) -> dict[str, Any]: ...
    @api(CALLER, served=True)  # a one-time Monkey Web login link (`monkey web`)
    def web_link(self, page: str = ...) -> str: ...
    @api(ADMIN, served=True)  # `monkey provider add WORDS` run by the main node itself
    def provider_add(self, words: list[str], name: str) -> dict[str, Any]: ...


class Wire(Protocol):
    """What a GATHERED method sends once the client has gathered its code and data."""

    def run(
        self,
        cmd: list[str],
        *,
        gathered: dict[str, Any],
        provider: str = ...,
        name: str | None = ...,
        sweep: str | None = ...,
        params: dict[str, Any] | None = ...,
        after: str | list[str] | None = ...,
        after_any: str | list[str] | None = ...,
        priority: int = ...,
        notify: str | list[str] | None = ...,
        cpus: int = ...,
        gpus: int = ...,
        memory: str | None = ...,
        host: str | None = ...,
        time: str | int | None = ...,
        image: str | None = ...,
        retries: int = ...,
    ) -> str: ...

    def sweep(
        self,
        command: str | list[str] | None = ...,
        *,
        gathered: dict[str, Any],
        file: dict[str, Any] | None = ...,
        provider: str = ...,
        grid: dict[str, list[Any]] | None = ...,
        random: int | None = ...,
        distributions: dict[str, dict[str, Any]] | None = ...,
        metric: str | None = ...,
        goal: str | None = ...,
        max_parallel: int | None = ...,
        retries: int | None = ...,
        early_terminate: str | dict[str, Any] | None = ...,
        seed: int | None = ...,
        name: str | None = ...,
        max_cells: int | None = ...,
        after: str | list[str] | None = ...,
        after_any: str | list[str] | None = ...,
        priority: int = ...,
        notify: str | list[str] | None = ...,
        cpus: int = ...,
        gpus: int = ...,
        memory: str | None = ...,
        host: str | None = ...,
        time: str | int | None = ...,
        image: str | None = ...,
    ) -> str: ...


_methods: dict[str, Rule] = {}


def methods() -> dict[str, Rule]:
    """Every method of the contract and its rule (read once; do not change it)."""
    if not _methods:
        _methods.update(
            (name, f.__api__)
            for cls in (Api, ServerApi)
            for name, f in vars(cls).items()
            if hasattr(f, "__api__")
        )
    return _methods


def signature_of(name: str) -> Callable[..., Any]:
    """The declaration whose parameters cross the wire for method NAME."""
    method: Callable[..., Any]
    if methods()[name].crossing == Crossing.GATHERED:
        method = getattr(Wire, name)
    else:
        method = getattr(ServerApi, name)
    return method
