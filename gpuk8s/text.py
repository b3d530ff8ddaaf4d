"""Host text made safe to show: control characters removed, so nothing a host returns can drive a terminal.

Everything a host or a remote command returns is data. `clean` removes C0 controls (except newline and
tab), DEL, C1 controls and the Unicode bidirectional overrides, so an escape sequence (colour, OSC-8
hyperlink, window title, cursor moves) or a reordered line can never reach the operator's terminal. It
runs where remote results and remote errors are built; rich renders such text as `Text`, never markup.
"""

from __future__ import annotations

import re

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text: str) -> str:
    """`text` without control characters (newline and tab kept); linear time."""
    return _CONTROLS.sub("", text)


def one_line(text: str) -> str:
    """`clean` text on one line: newlines and tabs become spaces (for a table cell or a log line)."""
    return clean(text).replace("\r", " ").replace("\n", " ").replace("\t", " ")


def first_of(items: list[str], cap: int) -> str:
    """The first `cap` items, comma separated, and how many more there are: a message stays short whatever a host
    or a cluster lists."""
    more = f" and {len(items) - cap} more" if len(items) > cap else ""
    return ", ".join(items[:cap]) + more


def ascii_int(text: str, max_digits: int = 9) -> int | None:
    """`text` as a non-negative integer if it is 1..max_digits ASCII digits, else None.

    str.isdigit() is True for "²" and "٣", which int() then rejects or reads as a number no host meant.
    """
    if 0 < len(text) <= max_digits and text.isascii() and text.isdecimal():
        return int(text)
    return None


def subsections(text: str, marker: re.Pattern[str]) -> dict[str, tuple[int, str]]:
    """A probe section's sub-sections: each starts at a line `marker` matches, whose groups are the name and the exit
    status (`@@mig NAME RC`, `@@drv NAME RC`), and runs to the next; name -> (exit status, output). Lines before the
    first marker are left out. Linear in the text."""
    out: dict[str, tuple[int, str]] = {}
    name: str | None = None
    rc = 0
    buf: list[str] = []
    for ln in text.splitlines():
        m = marker.match(ln)
        if m:
            if name is not None:
                out[name] = (rc, "\n".join(buf))
            name, rc, buf = m.group(1), int(m.group(2)), []
        elif name is not None:
            buf.append(ln)
    if name is not None:
        out[name] = (rc, "\n".join(buf))
    return out
