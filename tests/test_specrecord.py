"""A job's recorded job.yml read two ways (issue 41, findings 1 and 7): a spec a client sends
is refused field by field with one line, a stored one of any shape reads as a well-formed
spec, and a spec made from a real job.yml passes both unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monkey import jobspec
from monkey.models import MonkeyError
from monkey.specrecord import check_spec, stored_spec

# JSON values of any shape, with the spec's own keys likely to appear
KEYS = st.sampled_from(
    ["persist", "data", "env", "code", "providers", "env_type", "name", "path", "ignore", "x"]
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["/", "..", "../..", "a/../../b", "ok", "none", "\0"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS | st.text(max_size=4), inner),
    max_leaves=16,
)


def shape_ok(spec: dict) -> bool:
    """Whether SPEC has the shape every reader counts on."""
    return (
        isinstance(spec["env_type"], str)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in spec["env"].items())
        and isinstance(spec["code"]["path"], str)
        and all(set(p) == {"name", "path"} for p in spec["persist"])
        and all("/" not in p["name"] and not p["path"].startswith("/") for p in spec["persist"])
        and all({"name", "path", "type"} <= set(d) for d in spec["data"])
        and all(isinstance(v, dict) for v in spec["providers"].values())
    )


@settings(max_examples=80, deadline=None)
@given(JSON)
def test_a_stored_spec_of_any_shape_reads_as_a_well_formed_one(raw):
    spec = stored_spec(raw)
    assert spec is None or shape_ok(spec)
    try:
        checked = check_spec(raw)
    except MonkeyError as exc:  # a client's: refused in one line, never another error
        assert "\n" not in str(exc) and str(exc).startswith("spec")
    else:
        assert checked is None or shape_ok(checked)


def test_a_spec_made_from_a_job_yml_passes_both_readings_unchanged(tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "job.yml").write_text(
        "name: mnist\nrun:\n  env_type: pip\n  env_file: requirements.txt\n"
        "  env: [{SEED: '1'}]\ncode:\n  ignore: [venv**]\npersist:\n  - name: out\n"
        "    path: out/model\ndata:\n  - name: d\n    path: data\n    type: mount\n"
        "providers:\n  gcp: {machine_type: n1, preemptible: true}\n"
    )
    record = jobspec.load(tmp_path / "job.yml").to_json()
    record.update(
        env_file_digest="a" * 64, provider_options={"machine_type": "n1", "preemptible": True}
    )
    record["data"][0].update(digest="b" * 64, single=False, size=0, stored=0)
    assert check_spec(record) == record
    assert stored_spec(record) == record


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"persist": [{"name": "/abs", "path": "o"}]}, "spec.persist[0].name: '/abs' must be"),
        ({"persist": [{"name": "o", "path": "a/../../x"}]}, "spec.persist[0].path: 'a/../../x'"),
        ({"install_script": "~/x.sh"}, "spec.install_script: '~/x.sh' must be a relative path"),
        ({"env": {"A-B": "1"}}, "spec.env key: 'A-B' is not a variable name"),
        ({"code": {"path": ".", "ignore": ["x"] * 1001}}, "spec.code.ignore: has 1,001 entries"),
        ({"name": "\ud800"}, "spec.name: '\\ud800' is not valid Unicode text"),
        ({"providers": {"gcp": {"spot": "yes"}}}, "spec.providers.gcp.spot: must be bool"),
        ({"persist": [{"name": "o", "path": "a"}] * 2}, "spec.persist: the name 'o' is used twice"),
        (  # a persisted and a data folder may share a name, as in job.yml
            {
                "persist": [{"name": "d", "path": "p"}],
                "data": [
                    {
                        "name": "d",
                        "path": "q",
                        "type": "copy",
                        "compression": "none",
                        "digest": "c" * 64,
                        "single": False,
                        "size": 1,
                        "stored": 0,
                    }
                ],
            },
            None,
        ),
    ],
)
def test_a_wrong_field_of_a_sent_spec_is_named(change, said):
    base = {
        "file": "f",
        "name": None,
        "env_type": "none",
        "env_file": None,
        "env": {},
        "install_script": None,
        "code": {"path": ".", "ignore": []},
        "persist": [],
        "data": [],
        "providers": {},
        "provider_options": {},
    }
    if said is None:
        assert check_spec({**base, **change}) == {**base, **change}
        return
    with pytest.raises(MonkeyError) as err:
        check_spec({**base, **change})
    assert str(err.value).startswith(said), err.value
