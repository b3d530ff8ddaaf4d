"""The one deadline loop: a check asked again every few seconds until it holds or its time is up.

Every wait of a phase (a test pod, a node's GPUs offered again, GPU pods finishing before a drain, a rebooted host
answering SSH) goes through `until`, so that each says only what it waits for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], tuple[bool, T]], timeout: float, poll: float,
          sleep: Callable[[float], None] | None = None) -> tuple[bool, T]:
    """check(), asked again every `poll` seconds until it holds or `timeout` seconds have passed: its last answer.
    `sleep`: what waits between the asks (time.sleep; a test's own)."""
    deadline = time.monotonic() + timeout
    while True:
        ok, what = check()
        if ok or time.monotonic() > deadline:
            return ok, what
        (sleep or time.sleep)(poll)
