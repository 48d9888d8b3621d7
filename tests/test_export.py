"""`monkey export`: a tidy analysis database (and CSV files) a researcher queries with sqlite3,
pandas or Datasette; exporting again updates it; bad targets are refused, nothing written."""

from __future__ import annotations

import csv
import json
import sqlite3
import sys
from pathlib import Path

from conftest import wait_for

TRAIN = """\
import sys
import monkey
lr = float(sys.argv[2])
monkey.log_params({"opt": {"lr": lr, "name": "sgd"}})
for step in range(4):
    monkey.log("loss", 1 / (1 + lr * step), step=step)
monkey.summary(final_loss=1 / (1 + lr * 3))
print("epoch done, accuracy fine")
if lr > 0.05:
    print("RuntimeError: CUDA out of memory", file=sys.stderr)
    sys.exit(3)
"""


def _two_runs(cli, monkey) -> tuple[str, str, str]:
    Path("train.py").write_text(TRAIN)
    sid = cli(
        "sweep",
        "--grid",
        "lr=0.01,0.1",
        "--retries",
        "0",
        "--",
        sys.executable,
        "train.py",
        "--lr",
        "{lr}",
        check=True,
    ).stdout.strip()
    wait_for(
        lambda: monkey.store.get_sweep(sid)["state"] in ("finished", "failed"),
        timeout=120,
        what="the sweep to end",
    )
    ok, bad = (j.juid for j in monkey.store.list_jobs(sweep=sid, newest_first=False))
    return sid, ok, bad


def test_export_writes_tables_a_researcher_queries(cli, home, monkey, tmp_path):
    sid, ok, bad = _two_runs(cli, monkey)
    db_path, csv_dir = tmp_path / "runs.db", tmp_path / "csv"
    out = cli("export", "--sweep", sid, "--to", str(db_path), "--csv", str(csv_dir), check=True)
    assert out.stdout.startswith("exported 2 jobs (")
    db = sqlite3.connect(db_path)
    jobs = dict(db.execute("SELECT job, state FROM jobs ORDER BY job"))
    assert jobs == {ok: "succeeded", bad: "failed"}
    assert db.execute("SELECT exit_code, sweep FROM jobs WHERE job = ?", (bad,)).fetchone() == (
        3,
        sid,
    )
    # parameters and metrics as long tables, joined as a researcher would
    best = db.execute(
        "SELECT p.value, min(m.value) FROM metrics m JOIN params p ON p.job = m.job "
        "AND p.name = 'lr' WHERE m.name = 'loss' GROUP BY m.job ORDER BY p.value"
    ).fetchall()
    assert best == [(0.01, 1 / (1 + 0.01 * 3)), (0.1, 1 / (1 + 0.1 * 3))]
    assert db.execute(
        "SELECT value FROM params WHERE job = ? AND name = 'opt.name'", (ok,)
    ).fetchone() == ("sgd",)
    steps = [
        r[0]
        for r in db.execute(
            "SELECT step FROM metrics WHERE job = ? AND name = 'loss' ORDER BY seq", (ok,)
        )
    ]
    assert steps == [0, 1, 2, 3]
    assert db.execute(
        "SELECT value FROM summaries WHERE job = ? AND name = 'final_loss'", (bad,)
    ).fetchone() == (1 / 1.3,)
    # full-text search over output and commands
    hits = db.execute(
        "SELECT o.job, o.stream FROM outputs o JOIN outputs_fts f ON f.rowid = o.rowid "
        "WHERE outputs_fts MATCH 'cuda memory'"
    ).fetchall()
    assert hits == [(bad, "stderr")]
    commands = db.execute(
        "SELECT j.job FROM jobs j JOIN jobs_fts f ON f.rowid = j.rowid "
        "WHERE jobs_fts MATCH '\"train.py\"' ORDER BY j.job"
    ).fetchall()
    assert [c[0] for c in commands] == [ok, bad]
    assert db.execute("SELECT name, metric FROM sweeps").fetchall() == [(sid, None)]
    db.close()
    # the same tables as CSV files
    with open(csv_dir / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    loss = [r for r in rows if r["name"] == "loss"]  # (sys/cpu, sys/mem: as the job ran long)
    assert len(loss) == 8 and set(rows[0]) == {"job", "name", "seq", "step", "value", "wall_time"}
    assert sorted(p.name for p in csv_dir.iterdir()) == sorted(
        f"{t}.csv"
        for t in ("jobs", "params", "metrics", "summaries", "attempts", "outputs", "sweeps")
    )


def test_exporting_again_updates_the_database(cli, home, monkey, tmp_path):
    _, ok, bad = _two_runs(cli, monkey)
    db_path = tmp_path / "runs.db"
    cli("export", "--to", str(db_path), check=True)
    cli("retry", bad, check=True)
    wait_for(
        lambda: monkey.job(bad).status.value == "failed" and len(monkey.job(bad).attempts()) == 2,
        timeout=60,
        what="the retry to fail",
    )
    counts = json.loads(cli("export", bad, "--to", str(db_path), "--json", check=True).stdout)
    assert counts["jobs"] == 1 and counts["attempts"] == 2
    db = sqlite3.connect(db_path)
    assert db.execute("SELECT count(*) FROM jobs").fetchone() == (2,)  # ok's row kept
    assert db.execute("SELECT attempts FROM jobs WHERE job = ?", (bad,)).fetchone() == (2,)
    assert db.execute(
        "SELECT attempt, exit_code FROM attempts WHERE job = ? ORDER BY attempt", (bad,)
    ).fetchall() == [(1, 3), (2, 3)]
    assert db.execute(
        "SELECT count(*) FROM metrics WHERE job = ? AND name = 'loss'", (bad,)
    ).fetchone() == (8,)
    hits = db.execute(
        "SELECT o.attempt FROM outputs o JOIN outputs_fts f ON f.rowid = o.rowid "
        "WHERE outputs_fts MATCH 'cuda' ORDER BY o.attempt"
    ).fetchall()
    assert hits == [(1,), (2,)]
    db.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mh", "project", "runs.db"]


def test_export_refuses_a_target_it_must_not_write(cli, home, monkey, tmp_path):
    _, ok, _ = _two_runs(cli, monkey)
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    cases = [
        ((), "say where: --to runs.db (a SQLite file) and/or --csv DIR"),
        (
            ("--to", str(home / "monkey.db")),
            "is monkey's own database; write the export to another file",
        ),
        (("--to", str(text)), "is not a SQLite database; give a new file or an earlier export"),
        (("--to", str(tmp_path)), "is a folder; name the file to write"),
        (("--to", str(tmp_path / "nowhere" / "r.db")), "does not exist; create it"),
        (("--csv", str(text)), "is a file; give a folder"),
        (("--sweep", "sw-nope", "--to", str(tmp_path / "r.db")), "no sweep matches"),
    ]
    for args, message in cases:
        proc = cli("export", *args)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert text.read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mh", "notes.txt", "project"]
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE results(x)").connection.commit()
    proc = cli("export", ok, "--to", str(other))
    assert proc.returncode == 1 and "not a monkey export (it has tables results)" in proc.stderr
