"""Pure helpers of Monkey Web: a job's output as HTML (ANSI colours as spans, everything
escaped first) and table cells."""

from __future__ import annotations

import codecs
import html
import re
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def clock(ts: float | None) -> str:
    """TS as this machine's local date and time ("-": none)."""
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def cell(value: Any) -> str:
    """A table cell's text: numbers short, nothing as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.4g}"
    return str(value)


# An escape sequence: CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ESC \), or a
# two-byte one. Only SGR (CSI ... m) is drawn; the rest (cursor moves, clears) is dropped.
_ESCAPE = re.compile(r"\x1b(?:\[([0-9;:?]*)([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_OPEN = re.compile(r"\x1b(?:\[[0-9;:?]*|\][^\x07\x1b]*|\x1b?)?$")  # a sequence cut short
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


ERASE = "\r"  # in the HTML: the line so far is to be erased (by the page: static/web.js)


class AnsiHtml:
    """Turns a stream of output bytes into HTML, piece by piece: the text escaped, SGR
    colours and styles as ``<span class="a-...">``; a sequence or a UTF-8 character split
    between two pieces is kept until the next; the style carries over from one to the next.
    A carriage return rewrites its line as a terminal shows it (a progress bar redrawn
    1,000 times is one line in its last state): the redraws before the last of a piece are
    dropped, and the last one is preceded by ERASE, outside any tag, for the page to clear
    what it has of that line; a trailing carriage return waits for the next text."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._rest = ""
        self._erase = False  # a carriage return ended the text so far: the next text rewrites
        self.style: dict[str, str] = {}  # "fg", "bg", "b", "d", "i", "u" -> class

    def feed(self, data: bytes, final: bool = False) -> str:
        text = self._rest + self._decoder.decode(data, final)
        self._rest = ""
        if not final:
            cut = _OPEN.search(text)
            if cut and cut.group(0):
                text, self._rest = text[: cut.start()], cut.group(0)
        out: list[str] = []
        pos = 0
        for m in _ESCAPE.finditer(text):
            out.append(self._text(text[pos : m.start()]))
            if m.group(2) == "m":
                self._sgr(m.group(1) or "0")
            pos = m.end()
        out.append(self._text(text[pos:]))
        return "".join(out)

    def _text(self, text: str) -> str:
        out, run = [], ""  # run: the text since the last ERASE, styled as one span
        for i, line in enumerate(_CONTROL.sub("", text.replace("\r\n", "\n")).split("\n")):
            if i:
                run += "\n"
                self._erase = False
            redraws = line.split("\r")
            last = max((k for k, part in enumerate(redraws) if part), default=-1)
            if last >= 0:
                if (last > 0 and not i) or self._erase:  # a line begun here: all of it here
                    out += [self._styled(run), ERASE]
                    run = ""
                run += redraws[last]
            if len(redraws) > 1:  # a carriage return after the last text: the next rewrites
                self._erase = last < len(redraws) - 1
            elif last >= 0:
                self._erase = False
        return "".join([*out, self._styled(run)])

    def _styled(self, text: str) -> str:
        if not text:
            return ""
        escaped = html.escape(text, quote=True)
        classes = " ".join(self.style[k] for k in sorted(self.style) if not k.endswith("#"))
        inline = ""
        for key in ("fg", "bg"):  # 24-bit colours: a style, as its numbers only
            value = self.style.get(f"{key}#")
            if value:
                inline += f"{'color' if key == 'fg' else 'background-color'}:{value};"
        if not classes and not inline:
            return escaped
        attrs = (f' class="{classes}"' if classes else "") + (
            f' style="{inline}"' if inline else ""
        )
        return f"<span{attrs}>{escaped}</span>"

    def _sgr(self, params: str) -> None:
        codes = [int(c) if c.isdigit() else 0 for c in re.split("[;:]", params)]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                self.style = {}
            elif c in (1, 2, 3, 4):
                self.style["bdiu"[c - 1]] = f"a-{'bdiu'[c - 1]}"
            elif c == 22:
                self.style.pop("b", None)
                self.style.pop("d", None)
            elif c in (23, 24):
                self.style.pop("i" if c == 23 else "u", None)
            elif 30 <= c <= 37 or 90 <= c <= 97:
                self._colour("fg", c - 30 if c < 90 else c - 82)
            elif 40 <= c <= 47 or 100 <= c <= 107:
                self._colour("bg", c - 40 if c < 100 else c - 92)
            elif c in (39, 49):
                key = "fg" if c == 39 else "bg"
                self.style.pop(key, None)
                self.style.pop(f"{key}#", None)
            elif c in (38, 48) and i + 1 < len(codes):
                key = "fg" if c == 38 else "bg"
                if codes[i + 1] == 5 and i + 2 < len(codes):
                    self._colour(key, codes[i + 2])
                    i += 2
                elif codes[i + 1] == 2 and i + 4 < len(codes):
                    r, g, b = (max(0, min(255, v)) for v in codes[i + 2 : i + 5])
                    self.style.pop(key, None)
                    self.style[f"{key}#"] = f"#{r:02x}{g:02x}{b:02x}"
                    i += 4
            i += 1

    def _colour(self, key: str, n: int) -> None:
        self.style.pop(f"{key}#", None)
        if 0 <= n < 16:
            self.style[key] = f"a-{'f' if key == 'fg' else 'g'}{n}"
        elif 16 <= n < 256:  # the 256-colour cube and greys, as 24-bit
            self.style.pop(key, None)
            self.style[f"{key}#"] = _xterm(n)


def _xterm(n: int) -> str:
    if n >= 232:
        v = 8 + (n - 232) * 10
        return f"#{v:02x}{v:02x}{v:02x}"
    n -= 16
    steps = [0, 95, 135, 175, 215, 255]
    return f"#{steps[n // 36]:02x}{steps[n // 6 % 6]:02x}{steps[n % 6]:02x}"


def ansi_to_html(data: bytes) -> str:
    """DATA (a whole output) as HTML: see ``AnsiHtml``."""
    return AnsiHtml().feed(data, final=True)
