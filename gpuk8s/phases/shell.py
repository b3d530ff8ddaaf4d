"""The cluster phases' remote commands, rendered from the shell templates in playbooks/cluster/.

What runs on a host is readable beside the playbooks, and `--dry-run` shows the same text that runs. They
are rendered by the playbooks' own environment: every `{{ value }}` is shell-quoted, so no value can become
shell syntax. The helpers of `_lib.sh` are sent ahead of each command.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from gpuk8s.playbook.render import SHELL_ENV


@cache
def _source(name: str) -> str:
    return resources.files("gpuk8s.playbooks").joinpath(f"cluster/{name}.sh").read_text()


def command(name: str, **values: Any) -> str:
    """playbooks/cluster/NAME.sh rendered with `values` (quoted), without the helpers."""
    return SHELL_ENV.from_string(_source(name)).render(**values)


def script(name: str, **values: Any) -> str:
    """What is sent: the helpers of _lib.sh, then the command."""
    return _source("_lib") + command(name, **values)
