"""job.yml: the original sample loads, bad files fail with one clear line, `monkey init`
writes a file that loads back, and `monkey run` records the resolved spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monkey import jobspec
from monkey.models import MonkeyError

SAMPLE = """\
name: mnist
run:
  env_type: pip            # pip | conda | none
  env_file: requirements.txt
  env:
    - TEST_ENV: "HELLO"
  install_script: setup.sh # optional, run once per worker
code:
  path: "."
  ignore: ["data**", "output**", "venv**"]
persist:                   # folders kept across attempts and laid over the code at start
  - name: output
    path: output
data:                      # checksummed, uploaded only when changed
  - name: mnist-data
    type: copy
    path: data
    compression: gztar
providers:                 # per-provider machine options
  - name: gcp
    machine_type: n1-standard-2
    preemptible: true
"""


def sample_project(folder: Path) -> Path:
    (folder / "requirements.txt").write_text("tinypkg\n")
    (folder / "setup.sh").write_text("echo setting up\n")
    (folder / "data").mkdir()
    (folder / "data" / "x.txt").write_text("1\n")
    (folder / "output").mkdir()
    (folder / "output" / "stale.txt").write_text("from my laptop\n")
    (folder / "train.py").write_text("print('hi')\n")
    (folder / "job.yml").write_text(SAMPLE)
    return folder / "job.yml"


def test_the_original_sample_loads(tmp_path):
    spec = jobspec.load(sample_project(tmp_path))
    assert spec.name == "mnist"
    assert (spec.env_type, spec.env_file, spec.install_script) == (
        "pip",
        "requirements.txt",
        "setup.sh",
    )
    assert spec.env == {"TEST_ENV": "HELLO"}
    assert spec.ignore == ["data**", "output**", "venv**"]
    assert [(f.name, f.path) for f in spec.persist] == [("output", "output")]
    assert [(f.name, f.path, f.type, f.compression) for f in spec.data] == [
        ("mnist-data", "data", "copy", "gztar")
    ]
    assert spec.providers == {"gcp": {"machine_type": "n1-standard-2", "preemptible": True}}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("name: mnist", "name: mnist\nnmae: typo"),
            "job.yml:2: nmae: unknown key; allowed here: name, image, run, code, persist, data, providers",
        ),
        (
            ("env_type: pip ", "env_type: pipx"),
            "job.yml:3: run.env_type: 'pipx' is not allowed; use one of pip, conda, none",
        ),
        (
            ("preemptible: true", "preemptible: maybe"),
            "job.yml:22: providers.gcp.preemptible: must be true or false, not a string",
        ),
        (
            ("machine_type: n1-standard-2", "machine_tpye: n1"),
            "job.yml:21: providers[0].machine_tpye: unknown key; allowed here: name, size, machine_type",
        ),
        (
            ('ignore: ["data**", "output**", "venv**"]', "ignore: {a: 1}"),
            "job.yml:10: code.ignore: must be a list",
        ),
        (
            ("env_file: requirements.txt", "env_file: missing.txt"),
            "job.yml:4: run.env_file: {root}/missing.txt does not exist",
        ),
        (
            ("    path: output", "    path: ../output"),
            "job.yml:13: persist[0].path: '../output' is outside the project",
        ),
        (
            ("    path: output", "    path: /tmp/output"),
            "job.yml:13: persist[0].path: '/tmp/output' must be a relative path inside the project",
        ),
        (
            ("type: copy", "type: rsync"),
            "job.yml:16: data[0].type: 'rsync' is not allowed; use one of copy, mount",
        ),
        (
            ("compression: gztar", "compression: bz2"),
            "job.yml:18: data[0].compression: 'bz2' is not allowed; use one of gztar, zip, none",
        ),
        (
            ("    path: data", "    path: nodata"),
            "job.yml:17: data[0].path: {root}/nodata does not exist",
        ),
        (
            ('    - TEST_ENV: "HELLO"', "    - TEST-ENV: 1"),
            "job.yml:6: run.env.TEST-ENV: is not a valid variable name",
        ),
        (
            ("  - name: output", "  - name: ../../x"),
            "job.yml:12: persist[0].name: '../../x' must be 1 to 200 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit",
        ),
        (
            ("  - name: output", f"  - name: {'o' * 201}"),
            "job.yml:12: persist[0].name: '" + "o" * 201 + "' must be 1 to 200 letters",
        ),
        (
            ("    path: output", '    path: "out\\tput"'),
            "job.yml:13: persist[0].path: 'out\\tput' holds a control character",
        ),
        (("name: mnist", "name: [mnist"), "job.yml:2: invalid YAML"),
        (
            ('    - TEST_ENV: "HELLO"', '    - TEST_ENV: "HELLO"\n    - TEST_ENV: "BYE"'),
            "job.yml:7: run.env.TEST_ENV: is given twice",
        ),
    ],
)
def test_bad_job_files_name_the_key_line_and_fix(tmp_path, change, expected):
    path = sample_project(tmp_path)
    old, new = change
    path.write_text(SAMPLE.replace(old, new, 1))
    with pytest.raises(MonkeyError) as err:
        jobspec.load(path)
    message = str(err.value)
    assert "\n" not in message
    assert expected.format(root=tmp_path) in message, message
    assert message.startswith(str(path))


def test_the_stored_copy_of_a_job_file_holds_no_env_value(tmp_path):
    """Every way of writing a value (plain, quoted, block, folded, anchored, flow) becomes
    "<redacted>", and the copy is still a valid job.yml with the same everything else."""
    text = (
        "name: n  # a comment\nrun:\n  env:\n"
        "    - A: plain-value  # kept comment\n"
        "    - B: 'single'\n"
        '    - C: "double"\n'
        "    - D: |\n        line one\n        line two\n"
        "    - E: >-\n        folded\n"
        "    - F: &tok anchored\n"
        "    - G: *tok\n"
        "    - H: !!str 12\n"
        "code: {path: .}\n"
    )
    (tmp_path / "job.yml").write_text(text)
    spec = jobspec.load(tmp_path / "job.yml")
    assert spec.env == {
        "A": "plain-value",
        "B": "single",
        "C": "double",
        "D": "line one\nline two\n",
        "E": "folded",
        "F": "anchored",
        "G": "anchored",
        "H": "12",
    }
    copy = spec.redacted().decode()
    for value in ("plain-value", "single", "double", "line one", "folded", "anchored", "12"):
        assert value not in copy
    assert "# a comment" in copy and "# kept comment" in copy
    (tmp_path / "copy.yml").write_text(copy)
    again = jobspec.load(tmp_path / "copy.yml")
    assert again.env == dict.fromkeys(spec.env, "<redacted>")
    assert again.name == "n" and again.code_path == "."
    flow = tmp_path / "flow" / "job.yml"
    flow.parent.mkdir()
    flow.write_text("run: {env: {TOKEN: abc, SEED: 1}}\n")
    assert (
        jobspec.load(flow).redacted() == b'run: {env: {TOKEN: "<redacted>", SEED: "<redacted>"}}\n'
    )


def test_persist_and_data_folders_may_not_overlap(tmp_path):
    path = sample_project(tmp_path)
    path.write_text(SAMPLE.replace("    path: output", "    path: data/out"))
    with pytest.raises(
        MonkeyError, match=r"job.yml:17: data\[0\].path: 'data' overlaps 'data/out'"
    ):
        jobspec.load(path)


def test_run_refuses_bad_job_files_and_records_nothing(cli, home):
    sample_project(Path.cwd())
    Path("job.yml").write_text(SAMPLE.replace("env_file: requirements.txt", "env_file: 3"))
    proc = cli("run", "--", "python", "train.py")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"monkey: error: {Path.cwd() / 'job.yml'}:4: run.env_file: must be a string, not a "
        "whole number"
    ]
    assert "no jobs yet" in cli("list", "jobs", check=True).stdout
    # --no-job-yml leaves the file aside; --job-yml names another one.
    cli("run", "--no-job-yml", "--", "true", check=True)
    assert json.loads(cli("info", "job", "last", "--json", check=True).stdout)["spec"] is None
    Path("other.yml").write_text("name: other\n")
    cli("run", "--job-yml", "other.yml", "--", "true", check=True)
    info = json.loads(cli("info", "job", "last", "--json", check=True).stdout)
    assert info["name"] == "other" and info["spec"]["file"] == str(Path.cwd() / "other.yml")


def test_run_records_the_resolved_spec_and_leaves_data_and_output_out_of_the_code(monkey, home):
    sample_project(Path.cwd())
    job = monkey.run(
        "python train.py", env=["TEST_ENV=override", "API_TOKEN=s3cret"], start_core=False
    )
    record = job.record
    assert record.name == "mnist"
    assert record.env["TEST_ENV"] == "override"  # the command line wins over job.yml
    assert record.env["API_TOKEN"] == "<redacted>"
    spec = monkey.info(job.juid)["spec"]
    assert spec["file"] == str(Path.cwd() / "job.yml")
    assert spec["env_type"] == "pip" and spec["env_file_digest"] and spec["install_script_digest"]
    assert spec["data"][0]["digest"] and spec["data"][0]["stored"] > 0
    assert spec["provider_options"] == {}
    assert "s3cret" not in json.dumps(spec)
    from monkey.snapshot import BlobStore, load_manifest

    paths = [f.path for f in load_manifest(BlobStore(home / "blobs"), record.snapshot)]
    assert sorted(paths) == ["job.yml", "requirements.txt", "setup.sh", "train.py"]


def test_a_changed_data_folder_is_stored_again_an_unchanged_one_is_not(monkey, home):
    sample_project(Path.cwd())

    def stored() -> int:
        job = monkey.run("python train.py", start_core=False)
        return monkey.info(job.juid)["spec"]["data"][0]["stored"]

    assert stored() > 0
    assert stored() == 0
    Path("data/x.txt").write_text("2\n")
    assert stored() > 0
    assert stored() == 0


def test_the_local_provider_says_which_machine_options_it_ignores(monkey, home, caplog):
    sample_project(Path.cwd())
    Path("job.yml").write_text(SAMPLE + "  - name: local\n    disk: 100\n")
    job = monkey.run("python train.py", start_core=False)
    assert monkey.info(job.juid)["spec"]["provider_options"] == {"disk": 100}
    assert "provider 'local' ignores disk from" in caplog.text
    assert "(the options it takes: none)" in caplog.text


def test_init_writes_a_job_file_that_loads_back(cli, home):
    Path("requirements.txt").write_text("numpy\n")
    Path("output").mkdir()
    Path("data").mkdir()
    proc = cli("init", "--yes", "--data", "data", "--name", "digits")
    assert proc.returncode == 0, proc.stderr
    spec = jobspec.load("job.yml")
    assert spec.name == "digits"
    assert (spec.env_type, spec.env_file) == ("pip", "requirements.txt")
    assert [f.path for f in spec.persist] == ["output"]
    assert [(f.path, f.type) for f in spec.data] == [("data", "copy")]
    text = Path("job.yml").read_text()
    assert "# " in text  # commented for the reader
    again = cli("init", "--yes")
    assert again.returncode == 1
    assert "job.yml exists; edit it, or pass --force" in again.stderr
    assert Path("job.yml").read_text() == text


def test_init_asks_on_a_terminal_and_detects_conda(cli, home):
    Path("environment.yml").write_text("name: x\n")
    script = (
        "import sys; from monkey.shell.cli import main; "
        "sys.stdin.isatty = lambda: True; sys.exit(main(['init']))"
    )
    import subprocess
    import sys

    answers = "proj\n\n\n\n\n\n"  # name, then the detected defaults
    proc = subprocess.run(
        [sys.executable, "-c", script], input=answers, text=True, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "environment (pip, conda, none) [conda]" in proc.stdout
    spec = jobspec.load("job.yml")
    assert (spec.name, spec.env_type, spec.env_file) == ("proj", "conda", "environment.yml")


def test_init_on_a_terminal_asks_again_after_a_wrong_answer(cli, home):
    Path("requirements.txt").write_text("numpy\n")
    Path("data").mkdir()
    script = (
        "import sys; from monkey.shell.cli import main; "
        "sys.stdin.isatty = lambda: True; sys.exit(main(['init']))"
    )
    import subprocess
    import sys

    answers = "proj\npoetry\npip\nreqs.txt\nrequirements.txt\n\n../out\nout\nmissing\ndata\n"
    proc = subprocess.run(
        [sys.executable, "-c", script], input=answers, text=True, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "  answer one of pip, conda, none",
        f"  there is no file 'reqs.txt' in {Path.cwd()}; give one that exists",
        f"  '../out' is outside the project; give a folder inside {Path.cwd()}",
        f"  there is no folder 'missing' in {Path.cwd()}; give one that exists",
    ]
    spec = jobspec.load("job.yml")
    assert (spec.env_type, spec.env_file) == ("pip", "requirements.txt")
    assert [f.path for f in spec.persist] == ["out"] and [f.path for f in spec.data] == ["data"]


def test_init_refuses_an_env_file_that_does_not_exist(cli, home):
    proc = cli("init", "--yes", "--env-file", "reqs.txt")
    assert proc.returncode == 1
    assert "run.env_file:" in proc.stderr and "reqs.txt does not exist" in proc.stderr
    assert "job.yml:" in proc.stderr and ".job.yml.tmp" not in proc.stderr
    assert not Path("job.yml").exists() and not Path(".job.yml.tmp").exists()
