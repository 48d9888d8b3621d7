"""Many submitters at once, plus the core: unique ids, no lock errors."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO, wait_for

SUBMIT = """
import sys
from monkey.api import Monkey
m = Monkey()
ids = [m.run(["true"]).juid for _ in range(int(sys.argv[1]))]
print("\\n".join(ids))
"""


def test_eight_processes_submit_200_jobs_each(home, monkey):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen([sys.executable, "-c", SUBMIT, "200"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(8)
    ]
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "locked" not in err
        ids += out.split()
    assert len(ids) == 1600
    assert len(set(ids)) == 1600
    assert sorted(j.juid for j in monkey.store.list_jobs()) == sorted(ids)
    wait_for(lambda: monkey.store.count_jobs() == {"succeeded": 1600}, timeout=240,
             every=0.5, what="all 1600 jobs to finish")
