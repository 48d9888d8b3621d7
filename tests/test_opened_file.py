"""A stored file sent over HTTP is read from a descriptor opened before the answer
begins: a GC removing it meanwhile never cuts an answer short after its length was
promised (a laptop's blob download once got headers and no body)."""

from __future__ import annotations

import asyncio
import os

from monkey.server.opened import opened_file


def _send(answer) -> tuple[dict[bytes, bytes], bytes]:
    sent: list[dict] = []

    async def receive() -> dict:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "asgi": {"spec_version": "2.4"}}
    asyncio.run(answer(scope, receive, send))
    headers = dict(sent[0]["headers"])
    return headers, b"".join(m.get("body", b"") for m in sent[1:])


def test_a_file_removed_after_the_answer_began_is_sent_whole(tmp_path):
    blob = tmp_path / "blob"
    data = os.urandom(300_000)
    blob.write_bytes(data)
    answer = opened_file(blob, download_as="model ü.pt")
    assert answer is not None
    blob.unlink()  # the GC reclaims it between the headers and the body
    headers, body = _send(answer)
    assert body == data
    assert headers[b"content-length"] == b"300000"
    assert headers[b"content-disposition"] == b"attachment; filename*=UTF-8''model%20%C3%BC.pt"


def test_a_missing_file_or_a_folder_is_no_answer(tmp_path):
    assert opened_file(tmp_path / "gone") is None
    assert opened_file(tmp_path) is None
