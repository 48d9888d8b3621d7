"""The main node's audit log (monkey.server.audit): rotation by size with every line whole
while threads write at once, and a flood of refusals from one address counted, not
recorded line by line."""

from __future__ import annotations

import json
import os
import threading

from monkey.config import Home
from monkey.server import audit


def test_threads_writing_at_once_leave_whole_lines_in_rotated_private_files(tmp_path, monkeypatch):
    monkeypatch.setattr(audit, "SIZE", 4000)
    home = Home(tmp_path / "mh")

    def write(n: int) -> None:
        for i in range(100):
            audit.record(home, "cancel", user=f"u{n}", peer="127.0.0.1", target=f"job-{i}")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    files = sorted(p.name for p in (tmp_path / "mh" / "server").iterdir())
    assert files == ["audit.jsonl", *(f"audit.jsonl.{n}" for n in range(1, audit.KEEP))]
    for name in files:
        path = tmp_path / "mh" / "server" / name
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.path.getsize(path) <= 4000
        for line in path.read_text().splitlines():
            assert json.loads(line)["action"] == "cancel"
    events = audit.read(home)
    assert 60 < len(events) < 400 and [e["at"] for e in events] == sorted(e["at"] for e in events)
    assert events[-1]["target"] == "job-99"  # the newest kept, the oldest rotated away
    last = events[-1]["user"]
    assert {e["user"] for e in audit.read(home, user=last)} == {last}


def test_a_flood_of_refusals_is_counted_after_a_burst(tmp_path, monkeypatch):
    home = Home(tmp_path / "mh")
    monkeypatch.setattr(audit, "_refusals", {})
    for _ in range(audit.BURST + 30):
        audit.record(home, "token refused", peer="10.0.0.9", outcome="refused", token="zz")
    audit.record(home, "token refused", peer="10.0.0.8", outcome="refused", token="")
    events = audit.read(home)
    assert len(events) == audit.BURST + 1
    assert events[0]["token"] == "mk_zz…" and events[-1]["token"] == "(none)"
    monkeypatch.setattr(audit, "WINDOW", 0.0)  # the minute has passed
    audit.record(home, "token refused", peer="10.0.0.9", outcome="refused", token="zz")
    said = audit.read(home)[-2:]
    assert said[0]["detail"] == (
        "30 more refusals from this address in the minute before, not recorded one by one"
    )
    assert said[1]["token"] == "mk_zz…" and said[1]["outcome"] == "refused"


def test_a_full_table_of_refusals_still_limits_a_new_address(monkeypatch):
    """Past MOST buckets, the one refused longest ago is forgotten: a flood of addresses
    and prefixes never leaves a new address unlimited (it was: new buckets went uncounted)."""
    from monkey.server import auth

    monkeypatch.setattr(auth, "MOST", 50)
    gate = auth.Gate(lambda: None)  # type: ignore[arg-type,return-value]  # no user is asked
    for i in range(200):  # a flood: 200 addresses, one refusal each
        gate._count(auth.bucket(f"10.0.{i // 250}.{i % 250}", "mk_aa"), 1000.0 + i)
    target = auth.bucket("192.0.2.7", "mk_zz")
    for n in range(auth.FAILURES):
        assert gate.retry_after("192.0.2.7", "mk_zz", now=1300.0 + n) == 0
        gate._count(target, 1300.0 + n)
    assert gate.retry_after("192.0.2.7", "mk_zz", now=1310.0) > 0  # limited, table full or not
    assert len(gate._failures) == 50
