"""The storage contract, run against MONKEY_HOME and against S3 (moto's server on loopback)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from monkey.client_agent.blobs import put_file
from monkey.config import Home, ProviderConfig
from monkey.models import MonkeyError
from monkey.snapshot import BlobStore
from monkey.storage import Storage
from monkey.storage.base import local_tree
from monkey.storage.gcs import GCSStorage
from monkey.storage.local import LocalStorage
from monkey.storage.s3 import S3Storage
from tests.conftest import wait_for
from tests.test_gce import gce, gcs_server  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
BUCKET = "monkey-test"
MB = 1 << 20


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def moto_s3(moto: Any) -> str:
    """An empty moto (the shared fixture: fake credentials, nothing real read): its endpoint."""
    return moto.endpoint


def s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(signature_version="s3v4", s3={"addressing_style": "path"})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)


def make_s3(endpoint: str) -> S3Storage:
    """The storage of an ec2 provider whose bucket exists."""
    s3_client(endpoint).create_bucket(Bucket=BUCKET)
    config = ProviderConfig(
        "aws", "ec2", {"region": "us-east-1", "bucket": BUCKET, "endpoint": endpoint}
    )
    return S3Storage.from_config(config)


def make_gcs(gce: Any) -> GCSStorage:
    """The storage of a gce provider whose bucket exists (fake-gcs-server)."""
    storage = GCSStorage(
        BUCKET, credentials=gce.key, project="monkey-test", endpoint=gce.gcs.endpoint
    )
    assert storage.ensure_bucket() and not storage.ensure_bucket()
    return storage


@pytest.fixture(
    params=[
        "local",
        pytest.param("s3", marks=pytest.mark.system),
        pytest.param("gcs", marks=pytest.mark.system),
    ]
)  # moto, fake-gcs-server
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """Each implementation in turn (the local one is another MONKEY_HOME than the source's)."""
    if request.param == "local":
        return LocalStorage(Home(tmp_path / "home").ensure())
    if request.param == "gcs":
        return make_gcs(request.getfixturevalue("gce"))
    return make_s3(request.getfixturevalue("moto_s3"))


@pytest.fixture
def source(tmp_path: Path) -> BlobStore:
    """The submitting machine's blob store."""
    return BlobStore(tmp_path / "src-blobs")


def fresh(storage: Storage) -> Storage:
    """Another object over the same storage, that has seen nothing yet."""
    if isinstance(storage, LocalStorage):
        return LocalStorage(Home(storage.root))
    if isinstance(storage, GCSStorage):
        return GCSStorage(
            storage.bucket,
            credentials=storage.credentials,
            project=storage.project,
            endpoint=storage.endpoint,
        )
    assert isinstance(storage, S3Storage)
    return S3Storage(storage.bucket, endpoint=storage.endpoint, region=storage.region)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.read()


def make_tree(root: Path) -> None:
    """Nested folders, an empty one, and files of several modes."""
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "model.pt").write_bytes(os.urandom(3000))
    (root / "a" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "a" / "run.sh").chmod(0o755)
    (root / "a" / "b" / "secret").write_text("key")
    (root / "a" / "b" / "secret").chmod(0o600)
    (root / "a" / "b" / "c" / "deep.txt").write_text("deep")
    (root / "a" / "b").chmod(0o750)


# ---------------------------------------------------------------- blobs


def test_put_has_and_url_round_trip(storage: Storage, source: BlobStore) -> None:
    blobs = [b"print('hello')\n", b"", os.urandom(100_000)]
    digests = [source.put_bytes(data)[0] for data in blobs]
    assert storage.has(digests) == set()
    sent = storage.put_blobs(digests + digests[:1], source)  # a repeated digest goes once
    assert sent == sum(map(len, blobs))
    assert storage.has(digests + ["0" * 64]) == set(digests)
    for digest, data in zip(digests, blobs):
        assert fetch(storage.blob_url(digest, expires=60)) == data


def test_blob_uploaded_once(storage: Storage, source: BlobStore, tmp_path: Path) -> None:
    first, _ = source.put_bytes(b"one")
    second, _ = source.put_bytes(b"two!")
    assert storage.put_blobs([first], source) == 3
    assert storage.put_blobs([first], source) == 0
    assert fresh(storage).put_blobs([first, second], source) == 4
    assert storage.has([first, second]) == {first, second}


def test_small_blobs_go_in_packs_uploaded_once(
    moto_s3: str, source: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packs hold their blobs end to end, smallest first, each at most PACK_MAX bytes (a
    blob larger than that alone); the same set of blobs makes the same packs, stored once."""
    from monkey.storage import bucket

    monkeypatch.setattr(bucket, "PACK_MAX", 10)
    storage = make_s3(moto_s3)
    s3_client(moto_s3).put_bucket_versioning(
        Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"}
    )
    blobs = [b"four", b"4444", b"abcd", b"twelve bytes"]
    digests = [source.put_bytes(data)[0] for data in blobs]
    packs = storage.put_packs(digests + digests[:1], source)
    sizes = [[size for _d, size in index] for _key, index in packs]
    assert sorted(sizes) == [[4], [4, 4], [12]]
    by_digest = dict(zip(digests, blobs))
    for key, index in packs:
        assert fetch(storage.get_url(key, 60)) == b"".join(by_digest[d] for d, _size in index)
    assert fresh(storage).put_packs(reversed(digests), source) == packs
    versions = s3_client(moto_s3).list_object_versions(Bucket=BUCKET, Prefix="packs/")["Versions"]
    assert len(versions) == 3  # each stored once, by two storages
    tampered = source.path(digests[0])
    tampered.chmod(0o600)
    tampered.write_bytes(b"FOUR")
    with pytest.raises(MonkeyError, match=rf"^blob {digests[0]} in .* does not match its digest"):
        fresh(storage).put_packs([digests[0], source.put_bytes(b"new!")[0]], source)  # a new pack


@pytest.mark.parametrize("keys", [20_000, 0])
def test_has_many_digests(
    storage: Storage, source: BlobStore, keys: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many digests at once: a listing of blobs/ (or HEADs when the listing stops short)."""
    monkeypatch.setattr("monkey.storage.bucket._LIST_AT_MOST", keys)
    digests = [source.put_bytes(b"blob %d" % i)[0] for i in range(100)]
    storage.put_blobs(digests[:70], source)
    assert fresh(storage).has(digests) == set(digests[:70])


def test_large_blob_goes_in_parts(storage: Storage, source: BlobStore, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 * MB))
    digest, size, _ = source.put_path(big)
    seen: list[int] = []
    assert storage.put_blobs([digest], source, progress=seen.append) == 20 * MB
    assert sum(seen) == 20 * MB
    assert fetch(storage.blob_url(digest)) == big.read_bytes()
    if isinstance(storage, S3Storage):  # a multipart ETag ends with -<number of parts>
        head = s3_client(storage.endpoint).head_object(Bucket=BUCKET, Key=f"blobs/{digest}")
        assert head["ETag"].strip('"').endswith("-3")


def test_corrupted_local_blob_is_not_sent(storage: Storage, source: BlobStore) -> None:
    digest, _ = source.put_bytes(b"the real content")
    path = source.path(digest)
    path.chmod(0o600)
    path.write_bytes(b"rotten content!!")
    with pytest.raises(MonkeyError, match=digest[:16]):
        storage.put_blobs([digest], source)
    assert storage.has([digest]) == set()


def test_missing_local_blob_is_one_line(storage: Storage, source: BlobStore) -> None:
    with pytest.raises(MonkeyError, match=r"blob a{64} is missing from .*resubmit"):
        storage.put_blobs(["a" * 64], source)


def test_put_url_takes_a_file_from_a_worker(storage: Storage, tmp_path: Path) -> None:
    archive = tmp_path / "ckpt.tar"
    archive.write_bytes(os.urandom(70_000))
    key = "runs/26-01-01-001/1/outputs/ckpt.tar"
    put_file(str(archive), storage.put_url(key, expires=60))  # what the agent does
    back = tmp_path / "back" / "ckpt.tar"
    assert storage.get_file(key, back)
    assert back.read_bytes() == archive.read_bytes()
    assert not storage.get_file("runs/26-01-01-001/1/outputs/none", tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_s3_urls_are_signed_and_expire(moto: Any, source: BlobStore) -> None:
    """moto 5.2 serves presigned URLs whatever their signature or expiry; its gate
    (tests/s3_gate.py) checks them as S3 does and refuses a forged, an expired and a
    tampered URL."""
    storage = make_s3(moto.endpoint)
    digest, _ = source.put_bytes(b"signed")
    storage.put_blobs([digest], source)
    url = storage.blob_url(digest, expires=90)
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Expires"] == ["90"] and query["X-Amz-Signature"][0]
    assert "testing" in query["X-Amz-Credential"][0] and "secret" not in url.lower()
    assert fetch(url) == b"signed"

    signature = query["X-Amz-Signature"][0]
    forged = url.replace(signature, ("0" if signature[0] != "0" else "1") + signature[1:])
    other = url.replace(f"blobs/{digest}", f"blobs/{'0' * 64}")  # another key, same signature
    expired = storage.blob_url(digest, expires=1)
    stamp = urllib.parse.parse_qs(urllib.parse.urlparse(expired).query)["X-Amz-Date"][0]
    wait_for(
        lambda: time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 2)) > stamp,
        what="the URL to expire",
    )
    for bad in (forged, other, expired):
        with pytest.raises(urllib.error.HTTPError) as err:
            fetch(bad)
        assert err.value.code == 403
    assert [r.split(": ", 1)[1] for r in moto.server.gate.refused] == [
        "the signature does not match",
        "the signature does not match",
        "the presigned URL has expired",
    ]
    moto.server.gate.refused.clear()

    storage.delete(f"blobs/{digest}")
    with pytest.raises(urllib.error.HTTPError) as err:
        fetch(url)
    assert err.value.code == 404


def test_s3_upload_form_is_checked_as_s3_does(moto: Any, tmp_path: Path) -> None:
    """The agent's uploader posts under the form's prefix; S3's checks (the gate's) refuse a
    key outside it, a forged signature and an expired form, and store nothing of theirs."""
    from monkey.client_agent.results import Results

    storage = make_s3(moto.endpoint)
    form = storage.upload_form("runs/26-01-01-001/results", expires=600)
    assert form["url"].startswith(moto.endpoint) and "testing" not in json.dumps(
        form["fields"]
    ).replace(form["fields"]["x-amz-credential"], "")
    state = tmp_path / "ckpt" / "state.json"
    state.parent.mkdir()
    state.write_text('{"epoch": 3}')
    uploader = Results(
        {**form, "prefix": "runs/26-01-01-001/results", "dirs": {"checkpoint": str(state.parent)}},
        "26-01-01-001",
        1,
        str(tmp_path),
    )
    sent = uploader.upload()
    assert sent["files"] == 1 and sent["bytes"] == len('{"epoch": 3}')
    listed = s3_client(moto.endpoint).list_objects_v2(Bucket=BUCKET)["Contents"]
    stored = sorted(o["Key"] for o in listed)
    manifest = json.loads(fetch(storage.get_url("runs/26-01-01-001/results/manifest.json", 60)))
    sha = manifest["files"]["checkpoint/state.json"][0]
    assert fetch(storage.get_url(f"runs/26-01-01-001/results/objects/{sha}", 60)) == b'{"epoch": 3}'

    blob = tmp_path / "blob"
    blob.write_bytes(b"x")
    expired = storage.upload_form("runs/26-01-01-001/results", expires=-1)
    signature = form["fields"]["x-amz-signature"]
    forged = {**form, "fields": {**form["fields"], "x-amz-signature": signature[::-1]}}
    for bad, prefix in (
        (form, "runs/26-01-01-002/results"),
        (forged, "runs/26-01-01-001/results"),
        (expired, "runs/26-01-01-001/results"),
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            Results({**bad, "prefix": prefix}, "26-01-01-001", 1, "")._post_file(
                "objects/y", str(blob)
            )
        assert refused.value.code == 403
    assert [r.split(": ", 1)[1] for r in moto.server.gate.refused] == [
        "the form's key='runs/26-01-01-002/results/objects/y' does not meet "
        "['starts-with', '$key', 'runs/26-01-01-001/results/']",
        "the signature does not match",
        "the policy has expired",
    ]
    moto.server.gate.refused.clear()
    listed = s3_client(moto.endpoint).list_objects_v2(Bucket=BUCKET)["Contents"]
    assert sorted(o["Key"] for o in listed) == stored


def test_a_first_attempt_with_nothing_to_keep_stores_no_manifest(moto: Any, tmp_path: Path) -> None:
    """An empty manifest would say no more than none: a first attempt that never kept a file
    ends without a request. Once something was stored, every final upload is recorded, an
    empty one too (the checkpoint was deleted), and so is a later attempt's."""
    from monkey.client_agent.results import Results

    storage = make_s3(moto.endpoint)
    prefix = "runs/26-01-01-001/results"
    form = {**storage.upload_form(prefix, expires=600), "prefix": prefix}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()

    def keys() -> list[str]:
        listed = s3_client(moto.endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"].removeprefix(prefix + "/") for o in listed.get("Contents", []))

    first = Results(
        {**form, "dirs": {"checkpoint": str(ckpt)}, "outputs": ["*.csv"]},
        "26-01-01-001",
        1,
        str(tmp_path),
    )
    assert first.upload(final=True) == {"bytes": 0, "digest": None, "files": 0}
    assert keys() == []

    again = Results({**form, "dirs": {"checkpoint": str(ckpt)}}, "26-01-01-001", 1, str(tmp_path))
    (ckpt / "state.json").write_text("{}")
    assert again.upload()["files"] == 1
    (ckpt / "state.json").unlink()
    assert again.upload(final=True)["files"] == 0
    manifest = json.loads(fetch(storage.get_url(f"{prefix}/manifest.json", 60)))
    assert (manifest["seq"], manifest["final"], manifest["files"]) == (2, True, {})

    second = Results({**form, "dirs": {"checkpoint": str(ckpt)}}, "26-01-01-001", 2, str(tmp_path))
    assert second.upload(final=True)["digest"]
    assert "manifests/2-000001.json" in keys()


def test_restore_makes_the_kept_folders_hold_the_manifest_and_nothing_else(
    moto: Any, tmp_path: Path
) -> None:
    """What an earlier attempt on the same worker left after its last upload is not the
    job's newest consistent state: it goes. A folder the manifest does not name is made."""
    from monkey.client_agent.results import Results

    storage = make_s3(moto.endpoint)
    prefix = "runs/26-01-01-001/results"
    form = {**storage.upload_form(prefix, expires=600), "prefix": prefix}
    ckpt, persist = tmp_path / "ckpt", tmp_path / "persist"
    ckpt.mkdir()
    (ckpt / "epoch-1.pt").write_bytes(b"one")
    saver = Results({**form, "dirs": {"checkpoint": str(ckpt)}}, "26-01-01-001", 1, "")
    saver.upload()
    [(rel, (sha, size, mode))] = json.loads(fetch(storage.get_url(f"{prefix}/manifest.json", 60)))[
        "files"
    ].items()
    (ckpt / "epoch-2.pt").write_bytes(b"two, never uploaded")
    (ckpt / "old" / "deep").mkdir(parents=True)
    (ckpt / "old" / "deep" / "x").write_text("x")
    (ckpt / "link").symlink_to(tmp_path)

    restorer = Results(
        {**form, "dirs": {"checkpoint": str(ckpt), "persist": str(persist)}}, "26-01-01-001", 2, ""
    )
    url = storage.get_url(f"{prefix}/objects/{sha}", 60)
    assert restorer.restore({rel: [url, size, sha, mode]}) == 0  # there already: not fetched
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-1.pt"]
    assert (ckpt / "epoch-1.pt").read_bytes() == b"one"
    assert persist.is_dir() and not any(persist.iterdir())
    assert tmp_path.is_dir()  # a symlink's target is left alone


# ---------------------------------------------------------------- trees


def test_tree_round_trip(storage: Storage, tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    src.mkdir()
    make_tree(src)
    prefix = "runs/26-01-01-001/checkpoint"
    sent = storage.put_tree(src, prefix)
    assert sent == 3000 + 18 + 3 + 4
    assert storage.get_tree(prefix, copy) == sent
    assert local_tree(copy) == local_tree(src)  # folders, files, modes and mtimes
    assert (copy / "a" / "b" / "c" / "deep.txt").read_text() == "deep"

    # a second round moves only what changed, and removals reach the copy
    (src / "a" / "b").chmod(0o755)
    (src / "model.pt").unlink()
    (src / "a" / "run.sh").write_text("#!/bin/sh\necho changed\n")
    (src / "empty" / "new").write_bytes(b"12345")
    assert storage.put_tree(src, prefix) == len("#!/bin/sh\necho changed\n") + 5
    assert storage.put_tree(src, prefix) == 0
    assert storage.get_tree(prefix, copy) == len("#!/bin/sh\necho changed\n") + 5
    assert local_tree(copy) == local_tree(src)
    assert not (copy / "model.pt").exists()


def test_tree_emptied_and_absent(storage: Storage, tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("x")
    prefix = "runs/26-01-01-001/persist/data"
    storage.put_tree(src, prefix)
    storage.get_tree(prefix, copy)
    # a folder that is gone now counts as empty: the copy is emptied too
    storage.put_tree(tmp_path / "gone", prefix)
    assert storage.get_tree(prefix, copy) == 0
    assert list(copy.iterdir()) == []
    # a prefix that holds no tree leaves the local folder alone
    (copy / "mine").write_text("keep")
    assert storage.get_tree("runs/26-01-01-001/checkpoint", copy) == 0
    assert (copy / "mine").read_text() == "keep"


def test_delete(storage: Storage, source: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_tree(src)
    digest, _ = source.put_bytes(b"blob")
    storage.put_blobs([digest], source)
    storage.put_tree(src, "runs/26-01-01-001/checkpoint")
    storage.put_tree(src, "runs/26-01-01-001/persist/x")
    storage.delete("runs/26-01-01-001/checkpoint")
    assert storage.get_tree("runs/26-01-01-001/checkpoint", tmp_path / "c") == 0
    assert not (tmp_path / "c").exists()
    assert storage.get_tree("runs/26-01-01-001/persist/x", tmp_path / "p") > 0
    storage.delete(f"blobs/{digest}")
    assert storage.has([digest]) == set()
    storage.delete("runs/26-01-01-002")  # nothing there: not an error
    assert storage.put_blobs([digest], source) == 4  # sent again once deleted


@pytest.mark.parametrize(
    "key", ["../etc", "etc/passwd", "runs/../../x", "runs", "runs//x", "/runs/x"]
)
def test_keys_outside_the_layout_are_refused(storage: Storage, key: str, tmp_path: Path) -> None:
    with pytest.raises(MonkeyError, match="is not a storage key"):
        storage.put_tree(tmp_path, key)


# ---------------------------------------------------------------- S3 failures and setup


def test_missing_bucket_is_one_line(moto_s3: str, source: BlobStore) -> None:
    storage = S3Storage("no-such-bucket", endpoint=moto_s3, region="us-east-1")
    digest, _ = source.put_bytes(b"x")
    with pytest.raises(MonkeyError) as err:
        storage.put_blobs([digest], source)
    assert "no-such-bucket" in str(err.value) and "NoSuchBucket" in str(err.value)
    assert "\n" not in str(err.value)


def test_no_credentials_is_one_line(
    moto_s3: str, monkeypatch: pytest.MonkeyPatch, source: BlobStore
) -> None:
    storage = make_s3(moto_s3)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    digest, _ = source.put_bytes(b"x")
    fresh = S3Storage(BUCKET, endpoint=storage.endpoint)
    with pytest.raises(MonkeyError, match="no AWS credentials found; set `profile`"):
        fresh.put_blobs([digest], source)


def test_credentials_file_and_profile(
    moto_s3: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: BlobStore
) -> None:
    make_s3(moto_s3)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    creds = tmp_path / "aws-creds"
    creds.write_text("[lab]\naws_access_key_id = labkey\naws_secret_access_key = labsecret\n")
    config = ProviderConfig(
        "aws",
        "ec2",
        {"bucket": BUCKET, "endpoint": moto_s3, "credentials": str(creds), "profile": "lab"},
    )
    storage = S3Storage.from_config(config)
    digest, _ = source.put_bytes(b"via a profile")
    assert storage.put_blobs([digest], source) == len(b"via a profile")
    assert "labkey" in storage.blob_url(digest) and "labsecret" not in storage.blob_url(digest)
    wrong = S3Storage(BUCKET, endpoint=moto_s3, credentials=str(creds), profile="nope")
    with pytest.raises(MonkeyError, match="nope.*fix `profile`"):
        wrong.has([digest])


def test_each_cloud_kind_picks_its_bucket_storage() -> None:
    from monkey.drivers.ec2 import EC2Driver
    from monkey.drivers.gce import GCEDriver

    gcs = GCEDriver.bucket_storage(
        ProviderConfig("gcp", "gce", {"bucket": "g", "credentials": "/sa.json"})
    )
    assert isinstance(gcs, GCSStorage) and gcs.bucket == "g"
    s3 = EC2Driver.bucket_storage(
        ProviderConfig("aws", "ec2", {"bucket": "b", "region": "eu-west-1"})
    )
    assert isinstance(s3, S3Storage) and (s3.bucket, s3.region) == ("b", "eu-west-1")
    code = "import sys, monkey.storage, monkey.drivers.ec2; print('boto3' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "False"


def test_progress_bar_on_a_terminal(moto_s3: str, tmp_path: Path) -> None:
    """An upload from a terminal draws a bar on stderr (shown at once here)."""
    make_s3(moto_s3)
    script = f"""
import os, pathlib
from monkey.snapshot import BlobStore
from monkey.storage.s3 import S3Storage
src = BlobStore(pathlib.Path({str(tmp_path / "src")!r}))
big = pathlib.Path({str(tmp_path / "big")!r})
big.write_bytes(os.urandom(12 << 20))
digest = src.put_path(big)[0]
print(S3Storage({BUCKET!r}, endpoint={moto_s3!r}).put_blobs([digest], src))
"""
    leader, follower = pty.openpty()
    env = dict(os.environ, MONKEY_PROGRESS_AFTER="0", PYTHONPATH=str(REPO), COLUMNS="100")
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=follower, env=env, cwd=REPO
    )
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        screen += chunk
    out = proc.communicate(timeout=60)[0]
    os.close(leader)
    assert proc.returncode == 0, screen.decode(errors="replace")
    assert out.decode().strip() == str(12 << 20)
    text = screen.decode(errors="replace")
    assert "uploading" in text and "12.6/12.6 MB" in text


def test_gcs_urls_are_v4_signed_and_a_missing_bucket_is_one_line(
    gce: Any, source: BlobStore
) -> None:
    storage = make_gcs(gce)
    digest, _ = source.put_bytes(b"signed")
    storage.put_blobs([digest], source)
    url = storage.blob_url(digest, expires=60)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["X-Goog-Algorithm"] == ["GOOG4-RSA-SHA256"] and query["X-Goog-Expires"] == ["60"]
    assert "private_key" not in url and fetch(url) == b"signed"
    gone = GCSStorage("no-such-bucket", credentials=gce.key, endpoint=gce.gcs.endpoint)
    with pytest.raises(
        MonkeyError,
        match=r"^GCS bucket no-such-bucket: .*create it with `monkey provider add gcp`$",
    ):
        gone.put_blobs([digest], source)
