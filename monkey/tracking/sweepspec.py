"""Sweep specifications: parse (command line, YAML, Python), check, and expand into cells.

Pure functions, no I/O except reading a sweep file. A spec is a plain dict::

    {"command": [argv template], "method": "grid"|"random", "count": N | None,
     "parameters": {name: {"values": [...]} | {"distribution": D, "min": a, "max": b}},
     "metric": {"name": M, "goal": "max"|"min"} | None, "max_parallel": N | None,
     "early_terminate": {"type": "median"|"asha", ...} | None, "retries": N, "seed": S}

Placeholders in the command are ``{name}``; other braces are left alone.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_CELLS = 10_000  # cells of one sweep unless max_cells says otherwise
DISTRIBUTIONS = ("uniform", "log_uniform", "int_uniform", "choice")
EARLY_TERMINATE = ("median", "asha")
PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_.]*)\}")  # ${VAR} is the shell's
_KEYS = (
    "command",
    "method",
    "count",
    "parameters",
    "metric",
    "max_parallel",
    "early_terminate",
    "retries",
    "seed",
    "name",
)


def scalar(text: str) -> Any:
    """'3' -> 3, '0.1' -> 0.1, 'true' -> True, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _split_kv(flag: str, item: str, allow_empty: bool = False) -> tuple[str, str]:
    name, sep, rest = item.partition("=")
    if not sep or not name.strip() or not (rest.strip() or allow_empty):
        raise MonkeyError(f"{flag} {item!r} is not NAME=VALUES; write e.g. {flag} lr=0.01,0.1")
    return name.strip(), rest.strip()


def _range(flag: str, item: str) -> dict[str, Any]:
    name, rest = _split_kv(flag, item)
    low, sep, high = rest.partition(":")
    try:
        a, b = float(low), float(high)
    except ValueError:
        a = b = math.nan
    if not sep or math.isnan(a) or math.isnan(b):
        raise MonkeyError(f"{flag} {item!r} needs a range MIN:MAX, e.g. {flag} {name}=0.001:0.1")
    return {"name": name, "min": a, "max": b}


def from_options(
    command: list[str],
    *,
    grid: Sequence[str] = (),
    random_count: int | None = None,
    uniform: Sequence[str] = (),
    log_uniform: Sequence[str] = (),
    ints: Sequence[str] = (),
    choice: Sequence[str] = (),
) -> dict[str, Any]:
    """A spec from `monkey sweep` options (checked later by ``check``)."""
    params: dict[str, dict[str, Any]] = {}

    def put(name: str, value: dict[str, Any]) -> None:
        if name in params:
            raise MonkeyError(f"parameter {name!r} is given twice; give each parameter once")
        params[name] = value

    for item in grid:
        name, rest = _split_kv("--grid", item, allow_empty=True)
        put(name, {"values": [scalar(v) for v in rest.split(",") if v.strip()]})
    for item in choice:
        name, rest = _split_kv("--choice", item, allow_empty=True)
        put(
            name,
            {"distribution": "choice", "values": [scalar(v) for v in rest.split(",") if v.strip()]},
        )
    for flag, dist, items in (
        ("--uniform", "uniform", uniform),
        ("--log-uniform", "log_uniform", log_uniform),
        ("--int", "int_uniform", ints),
    ):
        for item in items:
            r = _range(flag, item)
            put(r["name"], {"distribution": dist, "min": r["min"], "max": r["max"]})
    return {
        "command": command,
        "method": "random" if random_count is not None else "grid",
        "count": random_count,
        "parameters": params,
    }


def load_file(path: str | Path) -> dict[str, Any]:
    """A spec from a YAML sweep file."""
    from monkey.config import read_yaml

    p = Path(path).expanduser()
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise MonkeyError(f"{p}: a sweep file is a mapping with `parameters:`; see the README")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise MonkeyError(f"{p}: unknown key {unknown[0]!r}; known keys: {', '.join(_KEYS)}")
    if not isinstance(data.get("name", ""), str):
        raise MonkeyError(f"{p}: name must be text, got {data['name']!r}")
    params = data.get("parameters")
    if not isinstance(params, dict):
        raise MonkeyError(f"{p}: `parameters:` must map each parameter to its values")
    data["parameters"] = {str(k): _param_from_yaml(p, str(k), v) for k, v in params.items()}
    return data


_PARAM_KEYS = ("distribution", "min", "max", "values", "value")


def _param_from_yaml(path: Path, name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        return {"values": value}
    if not isinstance(value, dict):
        return {"values": [value]}
    unknown = sorted(str(k) for k in value if k not in _PARAM_KEYS)
    if unknown:
        raise MonkeyError(
            f"{path}: parameter {name!r}: unknown key {unknown[0]!r}; "
            f"known keys: {', '.join(_PARAM_KEYS)}"
        )
    if "value" in value:
        return {"values": [value["value"]]}
    return dict(value)


def _has_nul(value: Any) -> bool:
    """Whether a NUL byte is in any text within VALUE (lists and mappings, keys included)."""
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with defaults filled in, or MonkeyError naming the first problem."""
    command = spec.get("command")
    if isinstance(command, str):
        import shlex

        try:
            command = shlex.split(command)
        except ValueError as exc:
            raise MonkeyError(
                f"sweep command {command!r}: {exc} (it is split as a shell would); close the quote"
            ) from None
    if command is not None and not (
        isinstance(command, list) and all(isinstance(a, str) for a in command)
    ):
        raise MonkeyError(
            f"sweep command must be text or a list of words, got {command!r}; "
            "e.g. command: python train.py --lr {lr}"
        )
    if not command:
        raise MonkeyError(
            "a sweep needs a command; write it after `--`, e.g. "
            "monkey sweep --grid lr=0.01,0.1 -- python train.py --lr {lr}"
        )
    if _has_nul([command, spec.get("parameters")]):
        raise MonkeyError(
            "the sweep's command or a parameter value contains a NUL byte (\\0), "
            "which no program can receive; remove it"
        )
    method = spec.get("method") or "grid"
    if method not in ("grid", "random"):
        raise MonkeyError(f"unknown sweep method {method!r}; use grid or random")
    params = spec.get("parameters") or {}
    if not params:
        raise MonkeyError("a sweep needs parameters, e.g. --grid lr=0.01,0.1")
    for name, p in params.items():
        _check_param(name, p, method)
    used = {m.group(1) for arg in command for m in PLACEHOLDER.finditer(arg)}
    for name in sorted(used - set(params)):
        raise MonkeyError(
            f"the command uses {{{name}}} but no parameter {name!r} is given; "
            f"add e.g. --grid {name}=1,2 or remove the placeholder"
        )
    for name in sorted(set(params) - used):
        if any(f"{{{name}:" in arg or f"{{{name}!" in arg for arg in command):
            raise MonkeyError(
                f"the command formats {{{name}}} (e.g. {{{name}:.3f}}), which sweeps "
                f"do not do; write plain {{{name}}}"
            )
        raise MonkeyError(
            f"parameter {name!r} is not used by the command; "
            f"put {{{name}}} in it, e.g. --{name.replace('_', '-')} {{{name}}}"
        )
    count = spec.get("count")
    if method == "random":
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise MonkeyError("a random sweep needs a count of runs >= 1, e.g. --random 20")
    elif count is not None:
        raise MonkeyError("count applies to random sweeps; use --random N (or method: random)")
    metric = spec.get("metric")
    if metric is not None:
        if isinstance(metric, str):
            metric = {"name": metric}
        if not isinstance(metric, dict) or not isinstance(metric.get("name"), str):
            raise MonkeyError(
                "metric must name a logged metric, e.g. metric: {name: acc, goal: max}"
            )
        goal = metric.get("goal")
        goal = (
            {"maximize": "max", "minimize": "min"}.get(goal, goal)
            if isinstance(goal, str)
            else goal
        )
        if goal not in ("max", "min", None):
            raise MonkeyError(f"metric goal {metric.get('goal')!r} is not max or min")
        if goal is None:  # loss, error, perplexity... are better low; the rest high
            from monkey.tracking.compare import goal_of

            goal = goal_of(metric["name"], {})
        metric = {"name": metric["name"], "goal": goal}
    for key in ("max_parallel", "retries"):
        value = spec.get(key)
        low = 1 if key == "max_parallel" else 0
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < low
        ):
            raise MonkeyError(f"{key} must be a whole number >= {low}, got {value!r}")
    early = spec.get("early_terminate")
    if early is not None:
        early = _check_early(early, metric)
    seed = spec.get("seed")
    return {
        "command": list(command),
        "method": method,
        "count": count,
        "parameters": params,
        "metric": metric,
        "max_parallel": spec.get("max_parallel"),
        "early_terminate": early,
        "retries": 2 if spec.get("retries") is None else spec["retries"],
        "seed": seed if isinstance(seed, int) else random.SystemRandom().randrange(1 << 31),
    }


def _check_param(name: str, p: dict[str, Any], method: str) -> None:
    if not PLACEHOLDER.fullmatch("{" + name + "}"):
        raise MonkeyError(f"parameter name {name!r} must be letters, digits, _ or .")
    dist = p.get("distribution")
    if dist is None or dist == "choice":
        values = p.get("values")
        if not isinstance(values, list) or not values:
            raise MonkeyError(
                f"parameter {name!r} has no values; give at least one, e.g. --grid {name}=1,2"
            )
        for value in values:
            if isinstance(value, float) and not _finite(value):
                raise MonkeyError(
                    f"parameter {name!r}: {value} is not a finite number; "
                    "give numbers like 0.1 or 1e-3"
                )
        return
    if dist not in DISTRIBUTIONS:
        raise MonkeyError(
            f"parameter {name!r}: unknown distribution {dist!r}; use one of "
            + ", ".join(DISTRIBUTIONS)
        )
    if method == "grid":
        raise MonkeyError(
            f"parameter {name!r} is drawn from a distribution; a grid needs "
            f"listed values, so use --random N (method: random)"
        )
    low: Any = p.get("min")  # checked numbers below
    high: Any = p.get("max")
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v) for v in (low, high)
    ):
        raise MonkeyError(
            f"parameter {name!r}: {dist} needs finite numeric min and max, got {low!r}:{high!r}"
        )
    if low > high:
        raise MonkeyError(f"parameter {name!r}: min {low} is above max {high}")
    if dist == "int_uniform" and not (float(low).is_integer() and float(high).is_integer()):
        raise MonkeyError(
            f"parameter {name!r}: int_uniform needs whole-number bounds, got {low}:{high}"
        )
    if dist == "log_uniform" and low <= 0:
        raise MonkeyError(f"parameter {name!r}: log_uniform needs min > 0, got {low}")


def _finite(value: float) -> bool:
    """Whether VALUE is a number a float can hold (not nan, inf or a 400-digit integer)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _check_early(early: Any, metric: dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(early, str):
        early = {"type": early}
    if not isinstance(early, dict) or early.get("type") not in EARLY_TERMINATE:
        raise MonkeyError(
            "early_terminate type must be median or asha, "
            "e.g. early_terminate: {type: median, min_steps: 3}"
        )
    if metric is None:
        raise MonkeyError(
            "early termination needs the metric to judge runs by; "
            "add metric: {name: ..., goal: max|min} (or --metric)"
        )
    unknown = sorted(str(k) for k in early if k not in ("type", "min_steps", "min_runs", "eta"))
    if unknown:
        raise MonkeyError(
            f"early_terminate: unknown key {unknown[0]!r}; "
            "known keys: type, min_steps, min_runs, eta"
        )
    out = {
        "type": early["type"],
        "min_steps": early.get("min_steps", 3),
        "min_runs": early.get("min_runs", 3),
        "eta": early.get("eta", 3),
    }
    for key in ("min_steps", "min_runs", "eta"):
        if not isinstance(out[key], int) or out[key] < 1 or (key == "eta" and out[key] < 2):
            raise MonkeyError(
                f"early_terminate {key} must be a whole number >= {2 if key == 'eta' else 1}"
            )
    return out


def size(spec: dict[str, Any], max_cells: int | None = None) -> int:
    """The number of cells of a checked spec (not expanded), or MonkeyError when it is more
    than ``max_cells`` (default MAX_CELLS): a typo's sweep would queue runs for weeks."""
    if max_cells is not None and (
        not isinstance(max_cells, int) or isinstance(max_cells, bool) or max_cells < 1
    ):
        raise MonkeyError(f"--max-cells must be a whole number >= 1, got {max_cells!r}")
    if spec["method"] == "random":
        count = spec["count"]
    else:
        count = math.prod(len(p["values"]) for p in spec["parameters"].values())
    cap = MAX_CELLS if max_cells is None else max_cells
    if count > cap:
        limit = f"the default cap of {cap:,}" if max_cells is None else f"--max-cells {cap:,}"
        raise MonkeyError(
            f"this sweep has {count:,} cells, more than {limit}; pass "
            f"--max-cells {count} (max_cells={count} in Python) if you mean it"
        )
    return count


def expand(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells of a checked spec: one dict of parameter values per run."""
    params = spec["parameters"]
    names = list(params)
    if spec["method"] == "grid":
        return [
            dict(zip(names, combo))
            for combo in itertools.product(*(params[n]["values"] for n in names))
        ]
    rng = random.Random(spec["seed"])
    return [{n: _draw(rng, params[n]) for n in names} for _ in range(spec["count"])]


def _draw(rng: random.Random, p: dict[str, Any]) -> Any:
    dist = p.get("distribution")
    if dist is None or dist == "choice":
        return rng.choice(p["values"])
    low, high = p["min"], p["max"]
    if dist == "uniform":
        return float(f"{rng.uniform(low, high):.6g}")  # the value the command line shows
    if dist == "log_uniform":
        return float(f"{math.exp(rng.uniform(math.log(low), math.log(high))):.6g}")
    return rng.randint(math.ceil(low), math.floor(high))


def render(command: list[str], cell: dict[str, Any]) -> list[str]:
    """The argv of one cell: each {name} replaced by its value."""
    return [PLACEHOLDER.sub(lambda m: str(cell[m.group(1)]), arg) for arg in command]
