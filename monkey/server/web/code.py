"""Monkey Web's code pages of a job: its snapshot's files as a tree, one file's text as the
job saw it (``Monkey.files`` and ``Monkey.cat``, as `monkey info job --files` and `monkey
cat`), the uncommitted diff against git HEAD the snapshot recorded, and the code diff
against another run (``Monkey.diff``'s code part, as `monkey diff A B`). Every logged-in
user reads them, as the API's ``info`` and ``diff`` let any user."""

from __future__ import annotations

from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from monkey.models import MonkeyError
from monkey.server.opened import opened_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from monkey.api import Monkey

    Web = Any  # monkey.server.web.app.Web (which imports this module)

SHOWN_BYTES = 512 * 1024  # a file's text shown at most; the rest by its download link
DIFF_LINES = 20_000  # a diff's lines shown at most
TREE_FILES = 5000  # files the tree lists at most (`monkey info job --files` lists all)
SNIFF = 8192  # a NUL in a file's first bytes makes it binary (as git decides)


def routes(web: Web, headers: Callable[[Response], Response]) -> list[Route]:
    """The code pages' routes, under /web (HEADERS: adds the app's security headers)."""
    pages = CodePages(web, headers)
    return [
        Route("/jobs/{ref}/code", pages.tree),
        Route("/jobs/{ref}/code/{path:path}", pages.file),
        Route("/jobs/{ref}/diff", pages.diff),
    ]


def safe_path(path: str) -> str | None:
    """PATH as a snapshot's relative POSIX path, or None when it is absolute, climbs out
    (``..``) or holds a backslash or NUL."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def diff_lines(text: str, most: int = DIFF_LINES) -> tuple[list[tuple[str, str]], int]:
    """A unified diff's lines as (kind, line), kind one of add, del, hunk, file, ctx;
    at most MOST of them, and how many were left out."""
    lines = text.splitlines()
    out = []
    for line in lines[:most]:
        if line.startswith(("+++", "---", "diff ", "index ", "Binary ")):
            kind = "file"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        elif line.startswith("@@"):
            kind = "hunk"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out, max(0, len(lines) - most)


def tree_page(m: Monkey, ref: str) -> dict[str, Any]:
    """The job's code files: {"job", "files": [{path, size, depth, name, dirs}], "total",
    "git"}; each file carries the folders it opens (``dirs``: the ones not shown before)."""
    job = m.get_job(ref)
    files = m.files(job.juid)
    rows = []
    seen: set[str] = set()
    for f in files[:TREE_FILES]:
        parts = f.path.split("/")
        opened = []
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder not in seen:
                seen.add(folder)
                opened.append({"name": parts[depth - 1], "depth": depth - 1})
        rows.append(
            {
                "path": f.path,
                "url": quote(f.path),
                "name": parts[-1],
                "depth": len(parts) - 1,
                "size": f.size,
                "dirs": opened,
            }
        )
    return {
        "job": job.juid,
        "name": job.name,
        "files": rows,
        "count": len(files),
        "total": sum(f.size for f in files),
        "git": _git_facts(job.git),
        "snapshot": bool(job.snapshot),
    }


def file_page(m: Monkey, ref: str, path: str) -> dict[str, Any]:
    """One file's page: {"job", "path", "size", "binary", "text", "truncated"}."""
    juid = m.resolve(ref)
    data = m.cat(juid, path)
    binary = b"\0" in data[:SNIFF]
    shown = b"" if binary else data[:SHOWN_BYTES]
    return {
        "job": juid,
        "path": path,
        "url": quote(path),
        "crumbs": _crumbs(path),
        "size": len(data),
        "binary": binary,
        "text": shown.decode("utf-8", "replace"),
        "truncated": not binary and len(data) > SHOWN_BYTES,
        "shown": SHOWN_BYTES,
    }


def git_diff_page(m: Monkey, ref: str) -> dict[str, Any]:
    """The uncommitted changes the job's snapshot recorded against its git HEAD."""
    from monkey.snapshot.blobs import BlobStore

    job = m.get_job(ref)
    git = job.git
    lines: list[tuple[str, str]] = []
    more = 0
    if not git.get("commit"):
        note = "this job's code was not in a git repository: there is no HEAD to compare with"
    elif not git.get("diff"):
        note = f"no uncommitted changes: the code is commit {git['commit'][:12]} as it was"
    else:
        blobs = BlobStore(m.home.blobs)
        if not blobs.has(git["diff"]):
            note = "the recorded diff is not on this node any more (`monkey gc` removed it?)"
        else:
            text = blobs.read_bytes(git["diff"]).decode("utf-8", "replace")
            lines, more = diff_lines(text)
            note = ""
    return {
        "job": job.juid,
        "against": None,
        "title": "against git HEAD",
        "git": _git_facts(git),
        "lines": lines,
        "more": more,
        "note": note,
        "summary": None,
    }


def run_diff_page(m: Monkey, ref: str, other: str) -> dict[str, Any]:
    """The code of job REF against job OTHER's (``Monkey.diff``'s code part, as `monkey
    diff OTHER REF`: lines of OTHER removed, of REF added)."""
    a, b = m.resolve(other), m.resolve(ref)
    if a == b:
        raise MonkeyError(f"compare job {b} with another job: give its id in `against`")
    found = m.diff(a, b)
    code = found.get("code")
    git = found.get("git", {})
    lines, more = diff_lines(code["diff"]) if code else ([], 0)
    note = "" if code else f"the same code: jobs {a} and {b} ran identical snapshots"
    return {
        "job": b,
        "against": a,
        "title": f"against job {a}",
        "git": None,
        "commits": git.get("commit"),
        "lines": lines,
        "more": more,
        "note": note,
        "summary": code and {k: code[k] for k in ("added", "removed", "changed")},
    }


def _git_facts(git: dict[str, Any]) -> dict[str, Any] | None:
    if not git.get("commit"):
        return None
    return {
        "commit": git["commit"],
        "branch": git.get("branch") or "",
        "dirty": bool(git.get("dirty") or git.get("diff")),
    }


def _crumbs(path: str) -> list[str]:
    return path.split("/")[:-1]


class CodePages:
    """The handlers, over WEB's sessions, facade and page rendering."""

    def __init__(self, web: Web, headers: Callable[[Response], Response]) -> None:
        self.web, self.headers = web, headers

    async def tree(self, request: Request) -> Response:
        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        ref = request.path_params["ref"]
        try:
            data = await run_in_threadpool(lambda: tree_page(self.web.monkey(), ref))
        except MonkeyError as exc:
            return self._error(session, ref, exc, 404)
        return self.web.page("code.html", session=session, **data)

    async def file(self, request: Request) -> Response:
        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        ref = request.path_params["ref"]
        path = safe_path(request.path_params["path"])
        if path is None:
            return self._error(
                session,
                ref,
                "a code path is relative to the job's folder, without `..`: "
                "pick a file from the job's code page",
                400,
            )
        m = self.web.monkey
        if request.query_params.get("raw"):
            try:
                stored = await run_in_threadpool(lambda: m().code_blob(ref, path))
            except MonkeyError as exc:
                return self._error(session, ref, exc, 404)
            answer = opened_file(stored, download_as=path.rsplit("/", 1)[-1])
            if answer is None:
                return self._error(session, ref, MonkeyError(f"{path} is gone from the store"), 404)
            return self.headers(answer)
        try:
            data = await run_in_threadpool(lambda: file_page(m(), ref, path))
        except MonkeyError as exc:
            return self._error(session, ref, exc, 404)
        return self.web.page("code_file.html", session=session, **data)

    async def diff(self, request: Request) -> Response:
        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        ref = request.path_params["ref"]
        other = request.query_params.get("against", "").strip()
        m = self.web.monkey
        try:
            if other:
                data = await run_in_threadpool(lambda: run_diff_page(m(), ref, other))
            else:
                data = await run_in_threadpool(lambda: git_diff_page(m(), ref))
        except MonkeyError as exc:
            return self._error(session, ref, exc, 404 if not other else 400)
        return self.web.page("code_diff.html", session=session, **data)

    def _error(
        self, session: dict[str, Any], ref: str, error: MonkeyError | str, status: int
    ) -> Response:
        return self.web.page(
            "error.html", status, session, title=f"Code of job {ref}", message=str(error)
        )
