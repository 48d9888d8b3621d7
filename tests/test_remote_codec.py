"""The codec RemoteMonkey and the server share: the facade's results come back as the types
the CLI prints (no server needed)."""

from __future__ import annotations

import math

import pytest

from monkey.models import Attempt, Job, MonkeyError, Resources, State
from monkey.remote import split_url
from monkey.remote.client import normal_fingerprint
from monkey.remote.codec import dumps, loads
from monkey.remote.settings import check_name
from monkey.tracking.ingest import as_columns


def test_a_field_a_newer_server_sends_is_dropped_not_a_crash():
    """A client of the same API reads a record with a field it does not know (a newer
    server's) as the record it knows."""
    sent = dumps(Job("26-11-27-001", "train", State.QUEUED, ["true"], "local"))
    newer = sent.replace(b'"priority":0', b'"priority":0,"colour":"blue"')
    assert b"colour" in newer
    assert loads(newer) == Job("26-11-27-001", "train", State.QUEUED, ["true"], "local")


def test_records_states_and_odd_floats_round_trip():
    job = Job(
        "26-11-27-001",
        "train",
        State.RUNNING,
        ["python", "t.py"],
        "local",
        Resources(cpus=2, memory="8G", time=60),
        env={"A": "1"},
        params={"lr": 0.1},
        unreachable_since=5.0,
    )
    attempt = Attempt("26-11-27-001", 1, "local", "live", started_at=1.0, spot=True, price=0.5)
    value = {
        "jobs": [job],
        "attempts": [attempt],
        "state": State.FAILED,
        "metrics": {"loss": [(1, float("nan"), 2.0), (2, float("inf"), 3.0)]},
    }
    back = loads(dumps(value))
    assert back["jobs"] == [job] and back["attempts"] == [attempt]
    assert back["state"] is State.FAILED
    (s1, v1, w1), (s2, v2, w2) = back["metrics"]["loss"]
    assert (s1, w1, s2, v2, w2) == (1, 2.0, 2, math.inf, 3.0) and math.isnan(v1)


@pytest.mark.parametrize(
    "text", ["SHA256:" + "AB" * 32, "sha256:" + ":".join(["ab"] * 32), "ab" * 32]
)
def test_fingerprints_are_accepted_in_the_usual_spellings(text):
    assert normal_fingerprint(text) == "SHA256:" + "ab" * 32


@pytest.mark.parametrize(
    "bad, says",
    [
        (lambda: normal_fingerprint("SHA256:abc"), "is not a SHA-256 fingerprint"),
        (lambda: split_url("ftp://host:1"), "is not a server URL"),
        (lambda: split_url("https://host:1/path"), "is not a server URL"),
        (lambda: split_url("http://10.0.0.1:8443"), "plain http is for loopback only"),
        (lambda: check_name("local"), "cannot name a remote"),
        (lambda: check_name("../x"), "cannot name a remote"),
    ],
)
def test_bad_remote_input_is_one_line_naming_the_fix(bad, says):
    with pytest.raises(MonkeyError, match=says):
        bad()


def test_urls_default_their_port():
    assert split_url("https://lab.example.org") == ("https", "lab.example.org", 8443)
    assert split_url("http://127.0.0.1:9000/") == ("http", "127.0.0.1", 9000)


def test_tokens_never_start_with_a_dash_and_hold_32_random_bytes():
    """`--token -x...` would read as a missing value (found: 1 start in 64 failed)."""
    from monkey.server.auth import new_token

    tokens = [new_token() for _ in range(2000)]
    assert all(t.startswith("mk_") and len(t) == 3 + 43 for t in tokens)
    assert len(set(tokens)) == len(tokens)


def _listed(value):
    """VALUE with tuples as lists (JSON has no tuples; the dashboard indexes either)."""
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_listed(v) for v in value]
    return value


def test_what_the_dashboard_reads_comes_back_as_it_was(home, monkey):
    from conftest import start_core, wait_for

    start_core(home)
    juid = monkey.run(["sleep", "60"], name="dash").juid
    wait_for(lambda: monkey.live_attempts(), what="a live attempt")
    with monkey.store.tx() as db:
        monkey.store._insert_columns(db, juid, 1, as_columns([("loss", 1, math.nan, 5.0)]))
    reads = {
        "jobs": monkey.jobs(),
        "jobs_changed": monkey.jobs_changed(0.0),
        "latest_metrics": monkey.latest_metrics([juid]),
        "live_attempts": monkey.live_attempts(),
        "instances": monkey.instances(),
        "monkey_instances": monkey.monkey_instances(),
        "core_status": monkey.core_status(),
        "info": monkey.info(juid),
        "metric_names": monkey.metric_names(juid),
    }
    for name, value in reads.items():
        back = loads(dumps(value))
        assert repr(back) == repr(_listed(value)), name  # repr: NaN is not equal to itself
    monkey.cancel(juid)
