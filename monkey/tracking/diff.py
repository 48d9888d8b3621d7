"""What differs between two jobs: command, parameters, environment, code, git, data, Python."""

from __future__ import annotations

import difflib

from monkey.models import Job
from monkey.snapshot.blobs import BlobStore
from monkey.snapshot.manifest import load_manifest
from monkey.tracking.ingest import flatten

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_DIFF_BYTES = 1 << 20  # larger files are reported as changed, not diffed


def mapping_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """key -> [value in a, value in b] for keys whose values differ (None: absent)."""
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def diff_jobs(
    blobs: BlobStore, a: Job, b: Job, packages: tuple[dict[str, str], dict[str, str]] | None = None
) -> dict[str, Any]:
    """Every section where A and B differ; empty sections are left out."""
    out: dict[str, Any] = {"jobs": [a.juid, b.juid]}
    if a.argv != b.argv:
        out["command"] = [a.command, b.command]
    sections = {
        "params": mapping_diff(flatten(a.params), flatten(b.params)),
        "env": mapping_diff(a.env, b.env),
        "datasets": mapping_diff(
            {d["name"]: d["digest"] for d in a.datasets},
            {d["name"]: d["digest"] for d in b.datasets},
        ),
        "resources": mapping_diff(a.resources.to_json(), b.resources.to_json()),
    }
    if a.provider != b.provider:
        sections["resources"]["provider"] = [a.provider, b.provider]
    out.update({k: v for k, v in sections.items() if v})
    if a.snapshot != b.snapshot and a.snapshot and b.snapshot:
        out["code"] = code_diff(blobs, a.snapshot, b.snapshot)
    git = git_diff(blobs, a.git, b.git)
    if git:
        out["git"] = git
    if a.python != b.python:
        out["python"] = [a.python, b.python]
    if packages is not None:
        changed = mapping_diff(*packages)
        if changed:
            out["packages"] = changed
    return out


def code_diff(blobs: BlobStore, digest_a: str, digest_b: str) -> dict[str, Any]:
    """Files added, removed and changed between two snapshots, with a unified diff."""
    files_a = {f.path: f.digest for f in load_manifest(blobs, digest_a)}
    files_b = {f.path: f.digest for f in load_manifest(blobs, digest_b)}
    changed = sorted(p for p in set(files_a) & set(files_b) if files_a[p] != files_b[p])
    patch = []
    for path in changed:
        patch += _text_diff(blobs, files_a[path], files_b[path], f"a/{path}", f"b/{path}")
    for path in sorted(set(files_b) - set(files_a)):
        patch += _text_diff(blobs, None, files_b[path], "/dev/null", f"b/{path}")
    for path in sorted(set(files_a) - set(files_b)):
        patch += _text_diff(blobs, files_a[path], None, f"a/{path}", "/dev/null")
    return {
        "added": sorted(set(files_b) - set(files_a)),
        "removed": sorted(set(files_a) - set(files_b)),
        "changed": changed,
        "diff": "".join(patch),
    }


def _text_diff(
    blobs: BlobStore, da: str | None, db: str | None, name_a: str, name_b: str
) -> list[str]:
    texts: list[list[str]] = []
    for digest in (da, db):
        if digest is None:
            texts.append([])
            continue
        data = blobs.read_bytes(digest)
        if len(data) > MAX_DIFF_BYTES or b"\0" in data[:8192]:
            return [f"Binary or large files {name_a} and {name_b} differ\n"]
        texts.append(data.decode(errors="replace").splitlines(keepends=True))
    lines = list(difflib.unified_diff(texts[0], texts[1], name_a, name_b))
    return [
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    ]


def git_diff(blobs: BlobStore, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Commit, branch and uncommitted-change differences of two jobs' git records."""
    out: dict[str, Any] = {}
    for key in ("commit", "branch", "dirty"):
        if a.get(key) != b.get(key):
            out[key] = [a.get(key), b.get(key)]
    if a.get("diff") != b.get("diff"):
        patches = [
            blobs.read_bytes(d).decode(errors="replace").splitlines(keepends=True)
            if d and blobs.has(d)
            else []
            for d in (a.get("diff"), b.get("diff"))
        ]
        out["uncommitted"] = "".join(
            difflib.unified_diff(
                patches[0], patches[1], "a.uncommitted.patch", "b.uncommitted.patch"
            )
        )
    return out
