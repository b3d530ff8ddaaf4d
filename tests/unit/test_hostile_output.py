"""Host text is data: markup and escape sequences from a host are shown literally, never interpreted.

The CLI runs against a scripted SSH server (tests/unit/hostile_ssh.py) whose fact probe answers with a GPU
name, kernel and OS name full of rich markup and terminal escapes, or whose SSH banner is hostile; the
rendering layer (ui.table, ui.say, the live view) is also tested directly.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpuk8s import ui
from gpuk8s.install.prepare import Event
from gpuk8s.logs import register_secret
from gpuk8s.report.live import LiveView
from tests.unit import hostile_ssh
from tests.unit.hostile_ssh import PROBE, HostileSSH

hostile_host = hostile_ssh.hostile_host  # the fixture

OSC8 = "\x1b]8;;http://evil\x1b\\"
TITLE = "\x1b]0;pwned\x07"
SUDO_PW = "pw-7Yq2-hostile"  # the host echoes the sudo password back: it must be masked wherever it is shown
GPU = f"NVIDIA [/bold] H100{OSC8}link {SUDO_PW}"
KERNEL = f"6.8.0-[red]x{TITLE}"
OS_NAME = f"Ubuntu [bold]22.04 {TITLE}\x1b[2J"
SHOWN = ("NVIDIA [/bold] H100", "6.8.0-[red]x", "Ubuntu [bold]22.04")  # as the operator must see them
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own styling: the only escape sequence allowed in terminal output

HOSTILE_PROBE = (PROBE.replace("NVIDIA H200", GPU).replace("6.18.44-fc-v657-gpu", KERNEL)
                 .replace('PRETTY_NAME="Ubuntu 24.04.3 LTS"', f'PRETTY_NAME="{OS_NAME}"'))


def hostile_answer(command: str) -> tuple[str, str, int]:
    if "@@gpuk8s-begin" in command:
        return HOSTILE_PROBE, "", 0
    return "", "not scripted\n", 127


def hostile_probe(server: HostileSSH) -> dict[str, str]:
    """Make `server` answer the probe with HOSTILE_PROBE, reached as a sudo user; the CLI's environment."""
    server.answer = hostile_answer
    server.write_inventory(user="ops", sudo_password_env="HOSTILE_SUDO_PW")
    return {"HOSTILE_SUDO_PW": SUDO_PW}


def assert_masked(text: str) -> None:
    assert SUDO_PW not in text and "********" in text


def run_in_terminal(tmp_path: Path, *args: str, merge_stderr: bool = True,
                    extra_env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`gpuk8s ARGS` with stdout on a pseudo-terminal (colours on): exit status, terminal text, stderr text
    (empty when stderr goes to the terminal too)."""
    import pty

    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS="300", LINES="60", GPUK8S_LOG_FILE=str(tmp_path / "gpuk8s.log"),
               **(extra_env or {}))
    master, slave = pty.openpty()
    with open(tmp_path / "stderr.txt", "wb") as err:
        p = subprocess.Popen([sys.executable, "-m", "gpuk8s", *args], stdin=subprocess.DEVNULL, stdout=slave,
                             stderr=slave if merge_stderr else err, env=env, cwd=tmp_path)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1)[0]:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    rc = p.wait(timeout=30)
    return rc, b"".join(chunks).decode("utf-8", "replace"), (tmp_path / "stderr.txt").read_text()


def assert_no_host_escapes(text: str, terminal: bool = False) -> None:
    if terminal:
        text = SGR.sub("", text)
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert "Traceback" not in text and "MarkupError" not in text, text


def strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in strings(k) + strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return []


# --- the CLI against a hostile host ------------------------------------------------------------------


def test_preflight_piped_shows_hostile_facts_literally(run_cli, hostile_host: HostileSSH):
    env = hostile_probe(hostile_host)
    r = run_cli("preflight", "--no-network", "-i", str(hostile_host.inventory), env=env, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    assert_no_host_escapes(r.stdout + r.stderr)
    assert_masked(r.stdout + r.stderr)
    for shown in SHOWN:
        assert shown in r.stdout
    command, stdin = hostile_host.execs[0]
    assert command.startswith("sudo -S ") and "@@gpuk8s-begin" in command and stdin == f"{SUDO_PW}\n".encode()


def test_preflight_on_a_terminal_shows_hostile_facts_literally(tmp_path, hostile_host: HostileSSH):
    env = hostile_probe(hostile_host)
    rc, out, _ = run_in_terminal(tmp_path, "preflight", "--no-network", "-i", str(hostile_host.inventory),
                                 extra_env=env)
    assert rc in (0, 1), out
    assert SGR.search(out), "expected a styled (terminal) rendering"
    assert_no_host_escapes(out, terminal=True)
    assert_masked(out)
    plain = SGR.sub("", out)
    for shown in SHOWN:
        assert shown in plain


def test_preflight_json_has_no_control_characters_and_no_secret(run_cli, hostile_host: HostileSSH):
    env = hostile_probe(hostile_host)
    r = run_cli("preflight", "--no-network", "-o", "json", "-i", str(hostile_host.inventory), env=env, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    assert_no_host_escapes(r.stderr)
    assert_masked(r.stdout)
    values = strings(json.loads(r.stdout))
    assert not [s for s in values if "\x1b" in s or "\x07" in s]
    for shown in SHOWN:
        assert any(shown in s for s in values)


BANNERS: dict[str, bytes | str] = {
    # text before the version line, then a version line paramiko rejects (its message quotes the line)
    "pre-version": b"\x1b]8;;http://evil\x1b\\[/bold]click\r\nSSH-\x1b]0;pwned\x07[/red]-x\r\n",
    "version": "SSH-\x1b]0;pwned\x07[/red]-x",
}


def _hostile_banner(server: HostileSSH, kind: str) -> None:
    banner = BANNERS[kind]
    if isinstance(banner, bytes):
        server.raw_banner = banner
    else:
        server.version = banner


@pytest.mark.parametrize("kind", sorted(BANNERS))
def test_hostile_banner_reports_the_host_unreachable(run_cli, tmp_path, hostile_host: HostileSSH, kind: str):
    _hostile_banner(hostile_host, kind)
    inv = str(hostile_host.inventory)
    r = run_cli("preflight", "--no-network", "-i", inv, timeout=60)
    assert r.returncode == 1
    assert_no_host_escapes(r.stdout)
    assert "# cp-1 (127.0.0.1, control-plane): FAIL" in r.stdout
    assert re.search(r"ssh\.reachable\tFAIL\tssh: SSH to 127\.0\.0\.1:\d+ failed: .*\[/red\]", r.stdout), r.stdout

    rc, out, _ = run_in_terminal(tmp_path, "preflight", "--no-network", "-i", inv, merge_stderr=False)
    assert rc == 1
    assert_no_host_escapes(out, terminal=True)
    assert "cp-1 (127.0.0.1, control-plane): FAIL" in out and "[/red]" in SGR.sub("", out)


@pytest.mark.parametrize("kind", sorted(BANNERS))
def test_hostile_banner_leaves_no_escape_on_stderr(run_cli, hostile_host: HostileSSH, kind: str):
    # paramiko logs the rejected banner (and a traceback) at ERROR; what reaches stderr must be clean too
    _hostile_banner(hostile_host, kind)
    r = run_cli("preflight", "--no-network", "-i", str(hostile_host.inventory), timeout=60)
    assert r.returncode == 1
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, repr(r.stderr)


# --- the rendering layer --------------------------------------------------------------------------------

GPU_SHOWN = "NVIDIA [/bold] H100]8;;http://evil\\link ********"  # GPU as shown, SUDO_PW registered
CELLS = ["gpu.count", "FAIL", f"1 x {GPU}\n  -> [bold red]fix[/] \x1b[2Jit\tnow", SUDO_PW]


def terminal_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=300, color_system="truecolor",
                   highlight=False, markup=False, emoji=False)


def test_table_on_a_terminal_renders_cells_as_text(monkeypatch):
    register_secret(SUDO_PW)
    con = terminal_console()
    monkeypatch.setattr(ui, "is_terminal", lambda: True)
    monkeypatch.setattr(ui, "console", lambda stderr=False: con)
    ui.table(f"host [/x] {TITLE}", ["check", "status", "detail", "token"], [CELLS], ["bold red"])
    ui.say(con, f"{KERNEL}: [/red] :fire: {SUDO_PW}", "red")
    out = con.file.getvalue()  # type: ignore[attr-defined]
    assert_no_host_escapes(out, terminal=True)
    plain = SGR.sub("", out)
    for shown in ("host [/x] ]0;pwned", GPU_SHOWN, "[bold red]fix[/]", "6.8.0-[red]x]0;pwned: [/red] :fire: ********"):
        assert shown in plain
    assert SUDO_PW not in plain


def test_table_piped_keeps_one_row_per_line(monkeypatch, capsys):
    register_secret(SUDO_PW)
    monkeypatch.setattr(ui, "is_terminal", lambda: False)
    ui.table(f"host\n{TITLE}", ["check", "status", "detail", "token"], [CELLS, ["a\tb", "c\rd", "e\x00", "f"]])
    lines = capsys.readouterr().out.splitlines()
    assert_no_host_escapes("\n".join(lines))
    assert len(lines) == 4 and lines[0] == "# host ]0;pwned"
    assert all(ln.count("\t") == 3 for ln in lines[1:])
    assert lines[2].split("\t") == ["gpu.count", "FAIL", f"1 x {GPU_SHOWN}   -> [bold red]fix[/] [2Jit now", "********"]
    assert lines[3] == "a b\tcd\te\tf"


def test_emit_json_cleans_and_masks_every_string(capsys):
    register_secret(SUDO_PW)
    ui.emit_json({"gpu": GPU, f"k{TITLE}": [SUDO_PW, {"n": 1, "s": "a\nb"}]})
    out = json.loads(capsys.readouterr().out)
    assert out == {"gpu": GPU_SHOWN, "k]0;pwned": ["********", {"n": 1, "s": "a\nb"}]}


def test_live_view_shows_hostile_steps_and_statuses_as_text(monkeypatch):
    con = terminal_console()
    monkeypatch.setattr(ui, "console", lambda stderr=False: con)
    view = LiveView(3)
    assert view.live.console is con
    view.event(Event("gpu-[/x]1", "preflight", status=f"blocked{TITLE}"))
    view.event(Event("gpu-2", "step", index=1, total=9, step=f"[/red]apt {OSC8}", status=f"[bold]ok\n{TITLE}"))
    view.event(Event("gpu-3", "host", status=f"[/]done{TITLE}"))
    con.print(view.render())
    out = con.file.getvalue()  # type: ignore[attr-defined]
    assert_no_host_escapes(out, terminal=True)
    plain = SGR.sub("", out)
    for shown in ("gpu-[/x]1: blocked by preflight", "step 1/9 [/red]apt ]8;;http://evil\\: [bold]ok ]0;pwned",
                  "gpu-3: [/]done]0;pwned", "2/3 hosts finished, 2 not done"):
        assert shown in plain


@pytest.mark.parametrize("terminal", [True, False])
def test_kubeadm_output_and_node_causes_are_shown_literally(monkeypatch, capsys, terminal: bool) -> None:
    """What kubeadm and kubectl print on a host reaches the phase table and the node table as text."""
    from gpuk8s.flows import ClusterReport
    from gpuk8s.kube.state import NodeCheck
    from gpuk8s.phases.base import PhaseError, PhaseResult
    from gpuk8s.report.cluster import render_cluster

    monkeypatch.setattr(ui, "is_terminal", lambda: terminal)
    err = PhaseError(f"kubeadm init failed: [ERROR Port-6443]: [/red] in use {TITLE}{OSC8}", "run [bold]this[/]")
    rep = ClusterReport(None, [PhaseResult("init", "kubeadm init", "failed", err.message, err.remedy)],
                        [NodeCheck("gpu-1", False, True, 4, 0, f"plugin says [/] {TITLE}could not load NVML")])
    render_cluster(rep, "install")
    out = capsys.readouterr()
    shown = SGR.sub("", out.out + out.err)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "[ERROR Port-6443]: [/red] in use" in shown and "run [bold]this[/]" in shown
    if terminal:  # a table cell wraps at the terminal's width: its words, in their own cell lines
        assert all(w in shown for w in ("plugin", "says", "[/]", "NVML"))
    else:
        assert "plugin says [/] ]0;pwnedcould not load NVML" in shown  # ESC and BEL removed, the rest literal
