"""The client of a main node (`monkey server`): its settings (``settings``), the HTTPS
connection (``client``), the codec both sides share (``codec``) and ``RemoteMonkey``, the
facade over it (``facade``). Standard library only: a one-shot command through a remote
loads neither the server's stack nor ``cryptography``.

The protocol: ``POST /api/v1/call/METHOD`` with a JSON body {"args": [...], "kwargs": {...}}
calls an allowed facade method; ``GET /api/v1/logs/JOB`` streams a job's output (``follow``
in framed pieces that say where each comes from, so a client resumes exactly). Every
request carries ``Authorization: Bearer TOKEN`` and ``X-Monkey-API``; every answer
``X-Monkey-API`` and ``X-Monkey-Version``."""

from __future__ import annotations

API = 1  # the protocol's version: a client and a server of different APIs refuse each other
API_HEADER = "X-Monkey-API"
VERSION_HEADER = "X-Monkey-Version"
UPGRADE = "pip install -U monkey-runner"
