"""The remote side of a playbook run: one POSIX sh script per host, and the parser for what it prints.

The script takes the host's lock, then for each step runs its check; only when the check fails does
it run the step's commands (set -e), and then the check again, which must now pass. It prints one
`@@gpuk8s-step` line per step as it goes (the client shows them live) and frames each step's output.
The first failed step ends the script; a re-run skips every step whose check passes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from gpuk8s.playbook.render import RenderedStep
from gpuk8s.text import ascii_int

STATE_DIR = "/var/lib/gpuk8s"  # lock, backups of changed files, pending-restart markers

PRELUDE = r"""
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C DEBIAN_FRONTEND=noninteractive
umask 022
GK_DIR=__STATE_DIR__
gk_backup() { # keep the original of a file the first time gpuk8s changes it (or note that there was none)
  b="$GK_DIR/backup$1"
  [ -e "$b" ] || [ -e "$b.absent" ] && return 0
  mkdir -p "$(dirname "$b")" || return 1
  if [ -e "$1" ]; then cp -p "$1" "$b.tmp" && mv -f "$b.tmp" "$b"; else : > "$b.absent"; fi
}
gk_put() { # PATH MODE BASE64: write atomically (temp file in the same directory, then rename)
  d=$(dirname "$1"); mkdir -p "$d" || return 1
  t=$(mktemp "$d/.gpuk8s.XXXXXX") || return 1
  if printf '%s' "$3" | base64 -d > "$t" && chmod "$2" "$t" && gk_backup "$1" && mv -f "$t" "$1"; then return 0; fi
  rm -f "$t"; return 1
}
gk_filter() { # PATH COMMAND ARGS...: replace the file by COMMAND ARGS PATH's output, atomically, same mode
  p=$1; shift
  t=$(mktemp "$(dirname "$p")/.gpuk8s.XXXXXX") || return 1
  if "$@" "$p" > "$t" && chmod --reference="$p" "$t" && gk_backup "$p" && mv -f "$t" "$p"; then return 0; fi
  rm -f "$t"; return 1
}
gk_edit() { p=$1; shift; gk_filter "$p" sed "$@"; }
gk_wait_dnf() { # SECONDS: dnf 4 waits without end for another dnf ("Waiting for process with pid N"): bound it
  n=0
  while :; do
    p=$(for f in /var/lib/dnf/rpmdb_lock.pid /var/cache/dnf/*_lock.pid; do
      q=$(cat "$f" 2>/dev/null) && [ -n "$q" ] && kill -0 "$q" 2>/dev/null && { echo "$q"; break; }; done; true)
    [ -z "$p" ] && return 0
    if [ "$n" -ge "$1" ]; then
      echo "Error: the rpm database is locked by process $p ($(cat /proc/"$p"/comm 2>/dev/null)) for more than $1 s" >&2
      return 1
    fi
    sleep 1; n=$((n + 1))
  done
}
gk_ctrd() { # containerd's merged configuration (`containerd config dump`) in the file $GK_CTRD; its exit status
  # read once per run: a dump is a Go process (~40 ms of CPU) and four checks read it; a step that ran drops it
  GK_CTRD=$GK_TMP/containerd-dump
  [ -e "$GK_CTRD.rc" ] || { containerd config dump > "$GK_CTRD" 2>/dev/null; echo $? > "$GK_CTRD.rc"; }
  read -r r < "$GK_CTRD.rc" && return "$r"
}
gk_mode_is() { [ "$(stat -c %a "$1" 2>/dev/null)" = "${2#0}" ]; }
gk_restart_pending() { [ -e "$GK_DIR/restart-$1" ]; }
gk_out() { echo "@@gpuk8s-out $1"; tail -c 65536 "$2"; echo; echo "@@gpuk8s-out-end $1"; }
gk_step() { # N RESTARTS
  if ( "gk_check_$1" ) >/dev/null 2>&1 </dev/null; then echo "@@gpuk8s-step $1 unchanged 0"; return 0; fi
  if [ "$GK_DRY" = 1 ]; then echo "@@gpuk8s-step $1 would-change 0"; return 0; fi
  o=$(mktemp) || { echo "@@gpuk8s-step $1 failed 1"; exit 1; }
  # the restart is owed from before the change: a run killed between the change and its end still restarts
  if [ -n "$2" ]; then mkdir -p "$GK_DIR" && touch "$GK_DIR/restart-$2"; fi
  ( set -e; "gk_run_$1" ) > "$o" 2>&1 </dev/null
  rc=$?
  gk_out "$1" "$o"; rm -f "$o" "$GK_TMP/containerd-dump" "$GK_TMP/containerd-dump.rc"
  if [ "$rc" != 0 ]; then echo "@@gpuk8s-step $1 failed $rc"; exit 1; fi
  if ! ( "gk_check_$1" ) >/dev/null 2>&1 </dev/null; then echo "@@gpuk8s-step $1 not-converged 0"; exit 1; fi
  echo "@@gpuk8s-step $1 changed 0"
}
GK_TMP=$(mktemp -d) || { echo "@@gpuk8s-fatal cannot create a temporary directory"; exit 1; }
trap 'rm -rf "$GK_TMP"' EXIT
trap 'exit 130' HUP INT TERM PIPE  # dash runs the EXIT trap on exit, not when a signal kills it (a dry run too)
if [ "$GK_DRY" != 1 ]; then
  mkdir -p "$GK_DIR" || { echo "@@gpuk8s-fatal cannot create $GK_DIR"; exit 1; }
  exec 9>>"$GK_DIR/lock"
  if ! flock -n 9; then echo "@@gpuk8s-lock busy $(cat "$GK_DIR/lock.owner" 2>/dev/null)"; exit 75; fi
  if [ -s "$GK_DIR/lock.owner" ]; then echo "@@gpuk8s-lock stale $(cat "$GK_DIR/lock.owner")"; fi
  printf '%s, pid %s, since %s\n' "$GK_OWNER" "$$" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$GK_DIR/lock.owner"
  trap 'rm -f "$GK_DIR/lock.owner"; rm -rf "$GK_TMP"' EXIT
  trap 'exit 130' HUP INT TERM PIPE
fi
""".replace("__STATE_DIR__", STATE_DIR)


def build_script(steps: list[RenderedStep], *, owner: str, dry_run: bool) -> str:
    """The whole remote script for one host. Step bodies are already rendered with quoted values."""
    parts = [f"GK_DRY={1 if dry_run else 0}", f"GK_OWNER={shlex.quote(owner)}", PRELUDE]
    for i, s in enumerate(steps):
        parts.append(f"gk_check_{i}() {{\n{s.check}\n}}\ngk_run_{i}() {{\n{s.run}\n}}")
    for i, s in enumerate(steps):
        parts.append(f"gk_step {i} {shlex.quote(s.restarts)}")
    parts.append('echo "@@gpuk8s-done"')
    return "\n".join(parts) + "\n"


STEP_LINE = re.compile(r"^@@gpuk8s-step ([0-9]{1,9}) (unchanged|changed|failed|not-converged|would-change) "
                       r"([0-9]{1,9})$")


@dataclass
class StepOutcome:
    index: int
    status: str  # unchanged | changed | would-change | failed | not-converged | not-run
    exit_status: int = 0
    output: str = ""


@dataclass
class ScriptOutcome:
    steps: dict[int, StepOutcome] = field(default_factory=dict)
    lock: str = ""  # '', 'busy OWNER' or 'stale OWNER'
    fatal: str = ""
    finished: bool = False


def stdin_launcher(size: int) -> str:
    """The command that runs a playbook script of `size` bytes sent on its stdin.

    Not `sh -c SCRIPT`: a command line is readable by every local user of the host (/proc/PID/cmdline) for as
    long as the run lasts, and a script may carry a file's content (a registry mirror's hosts.toml with its
    Authorization header). The script goes to a 0600 file in a fresh directory, whole or not at all, and is
    removed when the run ends; its steps read /dev/null, not the rest of the script.
    """
    return ("umask 077; d=$(mktemp -d /tmp/gpuk8s-playbook.XXXXXXXXXX) || exit 1; trap 'rm -rf \"$d\"' EXIT; "
            "trap 'exit 130' INT; trap 'exit 143' TERM; "
            f"head -c {int(size)} > \"$d/run.sh\" && [ \"$(wc -c < \"$d/run.sh\")\" -eq {int(size)} ] || "
            "{ echo 'gpuk8s: the playbook script did not arrive whole' >&2; exit 1; }; "
            "sh \"$d/run.sh\" </dev/null")


def parse_output(text: str) -> ScriptOutcome:
    """What the remote script reported, from its stdout. Pure: any text gives a ScriptOutcome."""
    res = ScriptOutcome()
    outputs: dict[int, list[str]] = {}
    current: int | None = None
    for line in text.splitlines():
        if current is not None:
            if line == f"@@gpuk8s-out-end {current}":
                current = None
            else:
                outputs[current].append(line)
            continue
        if line.startswith("@@gpuk8s-out ") and (n_out := ascii_int(line[13:])) is not None:
            current = n_out
            outputs[current] = []
        elif m := STEP_LINE.match(line):
            n = int(m.group(1))
            res.steps[n] = StepOutcome(n, m.group(2), int(m.group(3)))
        elif line.startswith("@@gpuk8s-lock "):
            res.lock = line[len("@@gpuk8s-lock "):]
        elif line.startswith("@@gpuk8s-fatal "):
            res.fatal = line[len("@@gpuk8s-fatal "):]
        elif line == "@@gpuk8s-done":
            res.finished = True
    for n, lines in outputs.items():
        if n in res.steps:
            res.steps[n].output = "\n".join(lines).strip("\n")
    return res
