"""S3 storage against moto's server on loopback: the figures of uploading blobs once by
digest and of a worker fetching them through presigned URLs, each beside a plain boto3 or
urllib baseline measured in the same run. moto answers far faster than S3 does, so the
ratios matter here, not the absolute times.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO  # noqa: F401 (puts the repository on sys.path)

SMALL, SMALL_SIZE, BIG = 1000, 4096, 100 << 20


def timed(label: str, fn, *args):  # noqa: ANN001, ANN202
    start = time.perf_counter()
    result = fn(*args)
    print(f"{label:<58} {time.perf_counter() - start:7.3f} s")
    return result


def slow_server(tmp: Path, digests: list[str]) -> None:
    """The worker's fetch when every request waits LATENCY first (S3's first byte is tens
    of milliseconds away; moto's is not): one download at a time against a few at once."""
    import http.server
    import threading

    from monkey.client_agent import blobs

    latency = 0.02

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            time.sleep(latency)
            self.send_response(200)
            self.send_header("Content-Length", str(SMALL_SIZE))
            self.end_headers()
            self.wfile.write(bytes(SMALL_SIZE))

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    urls = {d: [f"http://127.0.0.1:{httpd.server_port}/{d}", SMALL_SIZE] for d in digests}
    try:
        for threads in (1, blobs.FETCH_THREADS):
            blobs.FETCH_THREADS = threads
            shutil.rmtree(tmp / "slow", ignore_errors=True)
            timed(
                f"agent fetch_blobs: {len(urls)} blobs, {latency * 1000:.0f} ms each, "
                f"{threads} at once",
                blobs.fetch_blobs,
                urls,
                str(tmp / "slow"),
            )
    finally:
        httpd.shutdown()


def main() -> None:
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    os.environ.pop("AWS_PROFILE", None)
    from monkey.client_agent.blobs import fetch_blobs
    from monkey.snapshot import BlobStore
    from monkey.storage.s3 import S3Storage

    # moto in its own process, so that it does not share this one's interpreter lock
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    tmp = Path(tempfile.mkdtemp(prefix="monkey-bench-storage-"))
    try:
        source = BlobStore(tmp / "src")
        small = [source.put_bytes(os.urandom(SMALL_SIZE))[0] for _ in range(SMALL)]
        big_file = tmp / "big"
        big_file.write_bytes(os.urandom(BIG))
        big = source.put_path(big_file)[0]

        storage = S3Storage("bench", endpoint=endpoint, region="us-east-1")
        client = storage._s3()
        client.create_bucket(Bucket="bench")
        client.create_bucket(Bucket="baseline")
        print(f"{SMALL} blobs of {SMALL_SIZE} B, one of {BIG >> 20} MiB; moto at {endpoint}")

        def baseline_small() -> None:
            for d in small:
                client.put_object(Bucket="baseline", Key=d, Body=source.path(d).read_bytes())

        timed(f"baseline: boto3 put_object x{SMALL}, one after another", baseline_small)
        timed(f"put_blobs: {SMALL} small blobs", storage.put_blobs, small, source)
        fresh = S3Storage("bench", endpoint=endpoint, region="us-east-1")
        timed(f"has() of the {SMALL}, nothing known (lists blobs/)", fresh.has, small)
        again = S3Storage("bench", endpoint=endpoint, region="us-east-1")
        timed("put_blobs again on a fresh object: sends 0 bytes", again.put_blobs, small, source)
        timed(
            "baseline: boto3 upload_file of the big blob",
            client.upload_file,
            str(big_file),
            "baseline",
            "big",
        )
        timed("put_blobs: the big blob (hash check + multipart)", storage.put_blobs, [big], source)

        urls = {d: [storage.blob_url(d), SMALL_SIZE] for d in small}
        blobs_dir = tmp / "worker"
        timed(
            f"agent fetch_blobs: {SMALL} small blobs by presigned URL",
            fetch_blobs,
            urls,
            str(blobs_dir),
        )
        shutil.rmtree(blobs_dir)
        timed(
            "agent fetch_blobs: the big blob",
            fetch_blobs,
            {big: [storage.blob_url(big), BIG]},
            str(blobs_dir),
        )
        assert (blobs_dir / big[:2] / big[2:]).stat().st_size == BIG
        timed(
            "baseline: boto3 download_file of the big blob",
            client.download_file,
            "baseline",
            "big",
            str(tmp / "big.back"),
        )
        slow_server(tmp, small[:200])
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
