"""Image references as a user types them: Docker Hub's short names filled in, and each
malformed one refused at submission in one line naming what is wrong."""

from __future__ import annotations

import pytest

from monkey.images import parse
from monkey.models import MonkeyError

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "name", "tag", "digest"),
    [
        ("busybox", "docker.io/library/busybox", "latest", None),
        ("pytorch/pytorch:2.4.0-cuda12.1", "docker.io/pytorch/pytorch", "2.4.0-cuda12.1", None),
        (f"ghcr.io/o/r@{DIGEST}", "ghcr.io/o/r", None, DIGEST),
        (f"127.0.0.1:5000/lab/tiny:1@{DIGEST}", "127.0.0.1:5000/lab/tiny", "1", DIGEST),
        ("localhost/x", "localhost/x", "latest", None),
    ],
)
def test_a_reference_is_split_in_its_parts(text, name, tag, digest):
    ref = parse(text)
    assert (ref.name, ref.tag, ref.digest) == (name, tag, digest)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "give an image reference such as"),
        (" busybox", "give an image reference such as"),
        ("foo;rm -rf /", "is not a repository name"),
        ("UPPER/case:tag", "is not a repository name"),
        ("busybox:a/b", "is not a registry host"),
        ("busybox:-x", "is not a valid tag"),
        ("busybox@sha256:zz", "the digest must be sha256: and 64 hex digits"),
        ("../../etc", "is not a registry host"),
        ("localhost:99999/x", "'localhost:99999' is not a registry host"),
        ("localhost:0/x", "'localhost:0' is not a registry host"),
        ("a" * 300, "a repository name is at most 255 characters"),
    ],
)
def test_a_malformed_reference_is_one_line_naming_the_problem(text, says):
    with pytest.raises(MonkeyError) as caught:
        parse(text)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)
