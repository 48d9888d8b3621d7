"""Plots and reports drawn from the facade's data (``plot_data``, ``report_data``) and
written on this machine: a local ``Monkey`` and a remote's client (``RemoteMonkey``) draw
the same data the same way, so a file is never written on a main node."""

from __future__ import annotations

import os

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".pdf")


def plot(
    data: Callable[..., dict[str, Any]],
    refs: list[str],
    metrics: list[str] | str | None,
    out: str,
    x: str = "step",
    size: tuple[int, int] = (1000, 600),
    smooth: float = 0.0,
    log_y: bool = False,
    sweep: str | None = None,
) -> str:
    """Write the plot DATA (a facade's ``plot_data``) gives for these arguments to OUT;
    returns its path."""
    from monkey.tracking.plots import Style, png_plot

    check_out(out, "monkey plot", "acc.png", IMAGE_SUFFIXES)
    found = data(refs, metrics, x, smooth=smooth, log_y=log_y, sweep=sweep)
    try:
        width, height = size
        return str(png_plot(found["charts"], out, Style(**found["style"]), (width, height)))
    except OSError as exc:
        raise MonkeyError(f"cannot write {out}: {exc.strerror or exc}") from None


def report_html(found: dict[str, Any]) -> str:
    """The HTML report (self-contained: inline SVG and styles, no script) of FOUND, a
    facade's ``report_data``."""
    from monkey.tracking.plots import Style
    from monkey.tracking.report import jobs_report, sweep_report

    style = Style(**found["style"])
    if "status" in found:
        return sweep_report(
            found["status"], found["table"], found["charts"], style, found["analysis"]
        )
    return jobs_report(found["title"], found["summary"], found["table"], found["charts"], style)


def report(
    data: Callable[..., dict[str, Any]],
    ref: str | None,
    out: str,
    jobs: list[str] | None = None,
    title: str | None = None,
) -> str:
    """Write the HTML report of what DATA (a facade's ``report_data``) gives for the sweep
    REF or the JOBS to OUT; returns its path."""
    check_out(out, "monkey report", "report.html")
    html = report_html(data(ref, jobs, title))
    tmp = f"{out}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(html)
        os.replace(tmp, out)
    except OSError as exc:
        if os.path.isfile(tmp):
            os.unlink(tmp)
        raise MonkeyError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def check_out(out: str, command: str, example: str, suffixes: tuple[str, ...] = ()) -> None:
    """MonkeyError unless OUT names a file that can be written in an existing folder."""
    if os.path.isdir(out) or out.endswith(os.sep):
        raise MonkeyError(
            f"{command}: {out} is a folder; name the file to write, "
            f"e.g. {os.path.join(out, example)}"
        )
    folder = os.path.dirname(out) or "."
    if not os.path.isdir(folder):
        raise MonkeyError(
            f"{command}: folder {folder} does not exist; create it or write somewhere else"
        )
    if suffixes and os.path.splitext(out)[1].lower() not in suffixes:
        raise MonkeyError(
            f"{command}: cannot tell the image format of {out}; end the name "
            f"with {', '.join(suffixes)}, e.g. {example}"
        )
