"""Notes and tags on jobs and sweeps (`monkey job note|tag|untag`, `monkey sweep
note|tag|untag`, Monkey Web): checked here, kept in the store (monkey.store.notes)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from monkey.models import MonkeyError
from monkey.store.notes import TooManyTags

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.store import Store

NOTE_MAX = 10_000  # bytes of UTF-8 in a note
TAGS_MAX = 20  # tags on one job or sweep
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,31}")
TAG_RULE = "1 to 32 letters, digits and . _ - : + (starting with a letter or digit)"
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def check_note(text: str) -> str:
    """TEXT as a note (line ends as \n, trailing blanks dropped); MonkeyError naming what
    is wrong."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").rstrip()
    if not text:
        raise MonkeyError("the note is empty; give its text, or --clear to remove the note")
    size = len(text.encode())
    if size > NOTE_MAX:
        raise MonkeyError(
            f"the note is {size:,} bytes, over the {NOTE_MAX:,} allowed; shorten it "
            "(a longer text belongs in a file of the job)"
        )
    if _CONTROL.search(text):
        raise MonkeyError("the note holds control characters; write plain text (lines, tabs)")
    return text


def check_tags(tags: Iterable[str]) -> list[str]:
    """TAGS, each checked, without repeats; MonkeyError naming the first that is wrong."""
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not TAG.fullmatch(tag):
            raise MonkeyError(f"tag {tag!r}: a tag is {TAG_RULE}")
        if tag not in out:
            out.append(tag)
    return out


class Notes:
    """The notes and tags of jobs and sweeps; ACTOR() names who writes a note."""

    def __init__(self, store: Store, actor: Callable[[], str]) -> None:
        self.store, self.actor = store, actor

    def note(self, ref: str, text: str | None) -> dict[str, Any]:
        """Set job REF's note to TEXT (None removes it): {"id", "note", "tags"}."""
        return self._note("job", self.store.resolve(ref), text)

    def tag(
        self, ref: str, add: list[str] | None = None, remove: list[str] | None = None
    ) -> dict[str, Any]:
        """Add tags ADD to job REF and remove REMOVE: {"id", "note", "tags"}."""
        return self._tag("job", self.store.resolve(ref), add, remove)

    def sweep_note(self, ref: str, text: str | None) -> dict[str, Any]:
        """Set sweep REF's note to TEXT (None removes it): {"id", "note", "tags"}."""
        return self._note("sweep", self.store.resolve_sweep(ref), text)

    def sweep_tag(
        self, ref: str, add: list[str] | None = None, remove: list[str] | None = None
    ) -> dict[str, Any]:
        """Add tags ADD to sweep REF and remove REMOVE: {"id", "note", "tags"}."""
        return self._tag("sweep", self.store.resolve_sweep(ref), add, remove)

    def annotations(self, kind: str, key: str) -> dict[str, Any]:
        """{"id", "note": {"text", "at", "by"} or None, "tags"} of job or sweep KEY."""
        return {
            "id": key,
            "note": self.store.note_of(kind, key),
            "tags": self.store.tags_of(kind, [key]).get(key, []),
        }

    def _note(self, kind: str, key: str, text: str | None) -> dict[str, Any]:
        self.store.set_note(kind, key, None if text is None else check_note(text), self.actor())
        return self.annotations(kind, key)

    def _tag(
        self, kind: str, key: str, add: list[str] | None, remove: list[str] | None
    ) -> dict[str, Any]:
        add, remove = check_tags(add or ()), check_tags(remove or ())
        if not add and not remove:
            raise MonkeyError(f"name the tags to add or remove, e.g. `{kind} tag {key} baseline`")
        try:
            self.store.change_tags(kind, key, add, remove, TAGS_MAX)
        except TooManyTags as exc:
            raise MonkeyError(
                f"{kind} {key} would have {len(exc.tags)} tags, over the {TAGS_MAX} allowed; "
                f"untag some first"
            ) from None
        return self.annotations(kind, key)
