"""The agent fetches the blobs a start needs from presigned URLs (S3 on moto's server)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import test_agent
import test_storage
from test_agent import Client, World
from test_storage import make_s3

from monkey.client_agent.blobs import record_blob
from monkey.config import Home
from monkey.drivers.agent_link import AgentError
from monkey.snapshot import BlobStore
from monkey.storage.local import LocalStorage
from monkey.storage.s3 import S3Storage

# The fixtures of the agent's and the storage's tests, used here as they are.
world, agent = test_agent.world, test_agent.agent
moto_s3 = test_storage.moto_s3

CODE = b"import helper\nprint(helper.GREETING, open('data.bin', 'rb').read().hex())\n"
HELPER = b"GREETING = 'hello from s3'\n"


def upload(moto_s3: str, tmp_path: Path) -> tuple[list[list], dict[str, list]]:
    """Code stored on the submitting machine and sent to the bucket: (files, blob_urls)."""
    source = BlobStore(tmp_path / "src-blobs")
    storage = make_s3(moto_s3)
    files, urls = [], {}
    for rel, data in (("main.py", CODE), ("helper.py", HELPER), ("data.bin", bytes(range(8)))):
        digest, _ = source.put_bytes(data)
        files.append([rel, digest, 0o644])
        urls[digest] = [storage.blob_url(digest, expires=600), len(data)]
    storage.put_blobs(list(urls), source)
    return files, urls


def test_start_fetches_missing_blobs_then_runs(
    world: World, agent: Client, moto_s3: str, tmp_path: Path
) -> None:
    files, urls = upload(moto_s3, tmp_path)
    assert not any(world.blobs.iterdir())  # the worker has none of them
    world.start(agent, "j", ["python3", "main.py"], files=files, blob_urls=urls)
    assert agent.wait_exit("j")["code"] == 0
    out = (world.run_dir("j") / "stdout.log").read_text()
    assert out == "hello from s3 0001020304050607\n"
    for digest in urls:  # kept in the worker's store for the next job
        assert (world.blobs / digest[:2] / digest[2:]).is_file()
    assert not list(world.blobs.glob("*/.tmp-*"))
    # a second start finds them all there: the URLs are not used again
    dead = {d: ["http://127.0.0.1:9/gone", size] for d, (_url, size) in urls.items()}
    world.start(agent, "k", ["python3", "main.py"], files=files, blob_urls=dead)
    assert agent.wait_exit("k")["code"] == 0


@pytest.mark.parametrize("fault", ["missing key", "wrong size", "unreachable"])
def test_blob_that_cannot_be_fetched_refuses_the_start(
    world: World, agent: Client, moto_s3: str, tmp_path: Path, fault: str
) -> None:
    files, urls = upload(moto_s3, tmp_path)
    bad = files[0][1]  # main.py
    url, size = urls[bad]
    if fault == "missing key":
        absent = S3Storage(test_storage.BUCKET, endpoint=moto_s3, region="us-east-1")
        urls[bad] = [absent.blob_url("0" * 64, expires=600), size]  # signed, as S3 requires
        expected = f"missing blob {bad} could not be fetched: HTTP 404 (?i:not found)"
    elif fault == "wrong size":
        urls[bad] = [url, size + 1]
        expected = f"missing blob {bad} could not be fetched: {size} bytes instead of {size + 1}$"
    else:
        urls[bad] = ["http://127.0.0.1:9/nothing-listens-here", size]
        expected = rf"missing blob {bad} could not be fetched: \[Errno 111\] Connection refused$"
    with pytest.raises(AgentError, match=f"^{expected}"):
        world.start(agent, "j", ["sh", "-c", "touch ran"], files=files, blob_urls=urls)
    run = world.run_dir("j")
    assert not (run / "work" / "ran").exists() and not (run / "started").exists()
    assert not (run / "events.jsonl").exists()
    assert not (world.blobs / bad[:2] / bad[2:]).exists()
    assert not list(world.blobs.glob("*/.tmp-*"))
    assert agent.request("jobs")["jobs"] == []


def test_bad_blob_urls_are_refused(world: World, agent: Client) -> None:
    with pytest.raises(AgentError, match="blob_urls must map digests"):
        world.start(agent, "j", ["true"], blob_urls=["http://x"])
    with pytest.raises(AgentError, match="bad blob_urls entry"):
        world.start(agent, "j", ["true"], blob_urls={"a" * 64: "http://x"})
    with pytest.raises(AgentError, match="bad digest"):
        world.start(agent, "j", ["true"], blob_urls={"../x": ["http://x", 1]})


def test_local_storage_urls_work_too(world: World, agent: Client, tmp_path: Path) -> None:
    """The local storage hands out file:// URLs; the agent reads them the same way."""
    storage = LocalStorage(Home(tmp_path / "home").ensure())
    source = BlobStore(tmp_path / "src-blobs")
    digest, _ = source.put_bytes(b"echo from a file url\n")
    storage.put_blobs([digest], source)
    urls = {digest: [storage.blob_url(digest), os.path.getsize(storage.blobs.path(digest))]}
    world.start(agent, "j", ["sh", "run.sh"], files=[["run.sh", digest, 0o755]], blob_urls=urls)
    assert agent.wait_exit("j")["code"] == 0
    assert (world.run_dir("j") / "stdout.log").read_text() == "from a file url\n"


def upload_pack(moto_s3: str, tmp_path: Path) -> tuple[list[list], list, BlobStore]:
    """The code stored as one pack in the bucket: (files, blob_packs, the source store)."""
    source = BlobStore(tmp_path / "src-blobs")
    storage = make_s3(moto_s3)
    files = []
    for rel, data in (("main.py", CODE), ("helper.py", HELPER), ("data.bin", bytes(range(8)))):
        digest, _ = source.put_bytes(data)
        files.append([rel, digest, 0o644])
    key, index = storage.put_pack([d for _rel, d, _mode in files], source)
    return files, [[storage.get_url(key, expires=600), index]], source


def test_a_pack_brings_many_blobs_with_one_request(
    world: World, agent: Client, moto_s3: str, tmp_path: Path
) -> None:
    files, packs, source = upload_pack(moto_s3, tmp_path)
    # one of them is there already, with its check: the pack is read past it, and it is
    # left as it is
    kept = files[1][1]
    (world.blobs / kept[:2]).mkdir(parents=True)
    (world.blobs / kept[:2] / kept[2:]).write_bytes(HELPER)
    record_blob(str(world.blobs / kept[:2] / kept[2:]), hashlib.sha256(HELPER).hexdigest())
    before = (world.blobs / kept[:2] / kept[2:]).stat().st_ino
    world.start(agent, "j", ["python3", "main.py"], files=files, blob_packs=packs)
    assert agent.wait_exit("j")["code"] == 0
    assert (world.run_dir("j") / "stdout.log").read_text() == "hello from s3 0001020304050607\n"
    for _rel, digest, _mode in files:
        assert (world.blobs / digest[:2] / digest[2:]).read_bytes() == source.read_bytes(digest)
    assert (world.blobs / kept[:2] / kept[2:]).stat().st_ino == before
    assert not list(world.blobs.glob("*/.tmp-*"))
    # all there now: the pack is not fetched again
    dead = [["http://127.0.0.1:9/gone", packs[0][1]]]
    world.start(agent, "k", ["python3", "main.py"], files=files, blob_packs=dead)
    assert agent.wait_exit("k")["code"] == 0


@pytest.mark.parametrize("fault", ["short", "long"])
def test_a_pack_that_does_not_match_its_index_refuses_the_start(
    world: World, agent: Client, moto_s3: str, tmp_path: Path, fault: str
) -> None:
    files, packs, _source = upload_pack(moto_s3, tmp_path)
    url, index = packs[0]
    last, size = index[-1]
    if fault == "short":  # the index says the last blob is longer than what is stored
        index[-1] = [last, size + 5]
        expected = f"missing blob {last} could not be fetched: {size} bytes instead of {size + 5}$"
    else:
        index[-1] = [last, size - 1]
        expected = (
            f"missing blob {last} could not be fetched: its pack is longer than its index says$"
        )
    with pytest.raises(AgentError, match=f"^{expected}"):
        world.start(agent, "j", ["sh", "-c", "touch ran"], files=files, blob_packs=[[url, index]])
    run = world.run_dir("j")
    assert not (run / "work" / "ran").exists() and not (run / "started").exists()
    for digest, _size in index:  # none is put in place: which are right cannot be told
        assert not (world.blobs / digest[:2] / digest[2:]).exists()
    assert not list(world.blobs.glob("*/.tmp-*"))
    assert agent.request("jobs")["jobs"] == []


def test_bad_blob_packs_are_refused(world: World, agent: Client) -> None:
    with pytest.raises(AgentError, match="blob_packs list"):
        world.start(agent, "j", ["true"], blob_packs={"http://x": []})
    for bad in (
        ["http://x"],
        ["http://x", []],
        ["http://x", [["a" * 64, -1]]],
        ["http://x", [["a" * 64]]],
    ):
        with pytest.raises(AgentError, match="bad blob_packs entry"):
            world.start(agent, "j", ["true"], blob_packs=[bad])
    with pytest.raises(AgentError, match="bad digest"):
        world.start(agent, "j", ["true"], blob_packs=[["http://x", [["../x", 1]]]])


def test_a_fetched_blob_damaged_later_is_refused_removed_and_fetched_again(
    world: World, agent: Client, moto_s3: str, tmp_path: Path
) -> None:
    files, packs, source = upload_pack(moto_s3, tmp_path)
    world.start(agent, "j", ["python3", "main.py"], files=files, blob_packs=packs)
    assert agent.wait_exit("j")["code"] == 0
    # Someone flips a byte of the copy on the worker (same size): the next start refuses it
    # and removes it, naming the blob and the file; nothing runs.
    helper = files[1][1]
    blob = world.blobs / helper[:2] / helper[2:]
    blob.chmod(0o600)
    blob.write_bytes(HELPER.replace(b"s3", b"S3"))
    with pytest.raises(AgentError) as refused:
        world.start(agent, "k", ["python3", "main.py"], files=files)
    assert f"damaged blob {helper} for helper.py" in str(refused.value)
    assert not blob.exists() and not (world.run_dir("k") / "stdout.log").exists()
    # The core sends it again (here: the pack again): the job runs with the good bytes.
    world.start(agent, "m", ["python3", "main.py"], files=files, blob_packs=packs)
    assert agent.wait_exit("m")["code"] == 0
    assert (world.run_dir("m") / "stdout.log").read_text() == "hello from s3 0001020304050607\n"
    assert blob.read_bytes() == source.read_bytes(helper)


def test_a_blob_damaged_in_the_bucket_is_refused_and_stored_again(
    world: World, agent: Client, moto_s3: str, tmp_path: Path
) -> None:
    source = BlobStore(tmp_path / "src-blobs")
    storage = make_s3(moto_s3)
    files = []
    for rel, data in (("main.py", CODE), ("helper.py", HELPER), ("data.bin", bytes(range(8)))):
        digest, _ = source.put_bytes(data)
        files.append([rel, digest, 0o644])
    digests = [d for _rel, d, _mode in files]
    key, index = storage.put_pack(digests, source)
    # Someone rewrites the pack in the bucket: helper.py's bytes differ, sizes are the same.
    body = b"".join(source.read_bytes(d) for d, _size in index)
    s3 = test_storage.s3_client(moto_s3)
    s3.put_object(Bucket=test_storage.BUCKET, Key=key, Body=body.replace(b"s3", b"S3"))
    helper = files[1][1]
    packs = [
        [storage.get_url(key, expires=600), [[d, size, source.sha256(d)] for d, size in index]]
    ]
    with pytest.raises(AgentError) as refused:
        world.start(agent, "j", ["python3", "main.py"], files=files, blob_packs=packs)
    assert f"damaged blob {helper} in the bucket" in str(refused.value)
    assert not (world.blobs / helper[:2] / helper[2:]).exists()
    assert not list(world.blobs.glob("*/.tmp-*"))
    assert not (world.run_dir("j") / "stdout.log").exists()
    # The core distrusts it there: the pack is stored again from the checked copy.
    storage.distrust(helper)
    assert storage.put_pack(digests, source)[0] == key
    world.start(agent, "k", ["python3", "main.py"], files=files, blob_packs=packs)
    assert agent.wait_exit("k")["code"] == 0
    assert (world.run_dir("k") / "stdout.log").read_text() == "hello from s3 0001020304050607\n"
    # The same for a lone blob.
    single = source.put_bytes(b"x" * 5000)[0]
    storage.put_blobs([single], source)
    s3.put_object(Bucket=test_storage.BUCKET, Key=f"blobs/{single}", Body=b"y" * 5000)
    urls = {single: [storage.blob_url(single), 5000, source.sha256(single)]}
    lone = [*files, ["x.bin", single, 0o644]]
    with pytest.raises(AgentError, match=f"damaged blob {single} in the bucket"):
        world.start(agent, "m", ["python3", "main.py"], files=lone, blob_urls=urls)
    storage.distrust(single)
    assert storage.put_blobs([single], source) == 5000
    world.start(
        agent, "n", ["python3", "-c", "print(open('x.bin').read(3))"], files=lone, blob_urls=urls
    )
    assert agent.wait_exit("n")["code"] == 0
    assert (world.run_dir("n") / "stdout.log").read_text() == "xxx\n"
