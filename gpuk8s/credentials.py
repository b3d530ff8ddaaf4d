"""Sudo passwords: taken once from the environment or a prompt, registered for masking, never stored."""

from __future__ import annotations

import getpass
import os
import sys

from gpuk8s.errors import CredentialError
from gpuk8s.inventory.model import Inventory
from gpuk8s.logs import register_secret


def sudo_passwords(inv: Inventory) -> dict[str, str]:
    """Password per host name, for the hosts whose sudo mode is 'password'."""
    by_env: dict[str, str] = {}
    out: dict[str, str] = {}
    for host in inv.hosts:
        sudo = host.ssh.sudo
        if sudo.mode != "password" or host.ssh.user == "root":
            continue
        env = sudo.password_env
        if env not in by_env:
            value = os.environ.get(env)
            if value is None and sudo.prompt and sys.stdin.isatty():
                value = getpass.getpass(f"sudo password for {host.ssh.user} (hosts using ${env}): ")
            if value is None:
                raise CredentialError(
                    f"host {host.name} needs a sudo password: export {env}=... "
                    "(or set ssh.sudo.prompt: true to be asked on a terminal)")
            register_secret(value)
            by_env[env] = value
        out[host.name] = by_env[env]
    return out
