"""Monkey Web: the pages of a main node's server under /web (issue 28), served by
`monkey server` beside its API. ``app``: the routes, sessions and CSRF checks; ``views``:
what each page shows, read through the facade; ``render``: pure helpers (ANSI colours to
HTML, table cells); ``series``: the charts' series, cut down to their pixels; templates/ (Jinja2, autoescaped) and static/ (the script,
the style sheet, uPlot vendored: see static/vendor/README.md) ship in the wheel.

Only the server imports this package: a one-shot command never does (its sessions and
one-time links are files: see monkey.server.websession)."""
