"""--allow-reboot's waits (gpuk8s/phases/mig.py): a host that never goes down, and one that never comes back, each
end with their own bounded message; the lab test (tests/labtests/test_mig_install.py) covers the real reboot."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuk8s.inventory.loader import loads
from gpuk8s.phases import mig as migphase
from gpuk8s.phases import reboot as rebootmod
from gpuk8s.phases.base import Context, Options
from gpuk8s.remote import RemoteError

INV = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n  - name: w\n    address: 10.0.0.2\n"
            "    mig: {strategy: single, config: all-1g.10gb}\n")


@dataclass
class Res:
    ok: bool = True
    stdout: str = ""
    exit_status: int = 0


class FakeSession:
    """A session whose host answers while `answers()` says so; records what ran."""

    ran: list[str] = []
    answers = staticmethod(lambda: True)

    def __init__(self, host, password=None) -> None:
        self.host = host

    def run(self, command: str, **_kw) -> Res:
        FakeSession.ran.append(command)
        if command == "systemctl reboot":
            raise RemoteError("cut", "the connection to w was lost")  # the reboot drops it: expected
        if not FakeSession.answers():
            raise RemoteError("refused", "connection refused by 10.0.0.2:22")
        return Res()

    def close(self) -> None:
        pass


@pytest.fixture
def ctx(monkeypatch):
    monkeypatch.setattr(rebootmod, "Session", FakeSession)
    monkeypatch.setattr(rebootmod, "POLL", 0.01)
    FakeSession.ran = []
    c = Context(INV, options=Options(allow_reboot=True, reboot_timeout=0.2))
    c.sessions["w"] = FakeSession(INV.host("w"))
    return c


def test_a_host_that_keeps_answering_after_the_reboot_command(ctx, monkeypatch) -> None:
    monkeypatch.setattr(rebootmod, "DOWN_TIMEOUT", 0.1)
    FakeSession.answers = staticmethod(lambda: True)
    status, detail = migphase.Mig._reboot(ctx, migphase.HostMig(INV.host("w")), "GPU 1 (in use)")
    assert status == "failed" and "still answered SSH after 0.1 s" in detail and "reboot it by hand" in detail
    assert FakeSession.ran[0] == "systemctl reboot"


def test_a_host_that_does_not_come_back(ctx) -> None:
    FakeSession.answers = staticmethod(lambda: False)
    status, detail = migphase.Mig._reboot(ctx, migphase.HostMig(INV.host("w")), "GPU 1 (in use)")
    assert status == "failed" and "did not answer SSH within 0.2 s after the reboot" in detail
    assert "check its console" in detail
    assert ctx.sessions["w"] is not None and FakeSession.ran.count("true") >= 2  # it polled, bounded


def test_wait_up_returns_the_open_session_once_the_host_is_back(monkeypatch) -> None:
    monkeypatch.setattr(rebootmod, "Session", FakeSession)
    monkeypatch.setattr(rebootmod, "POLL", 0.01)
    calls = iter([False, False, True])
    FakeSession.answers = staticmethod(lambda: next(calls))
    s = rebootmod.wait_up(INV.host("w"), None, 5)
    assert isinstance(s, FakeSession)
