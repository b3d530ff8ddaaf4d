"""python -m tests.lab up FLEET.yaml | down | status"""

from __future__ import annotations

import argparse
import sys
import time

from tests.lab.lab import Lab, LabError


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create the hosts of a fleet file; prints the inventory path last")
    up.add_argument("fleet")
    up.add_argument("--subnet", help="lab subnet (default: the fleet's, else 10.213.0.0/16)")
    sub.add_parser("down", help="remove everything the lab created (safe to run twice)")
    sub.add_parser("status", help="list the lab's hosts")
    a = ap.parse_args()
    lab = Lab()
    try:
        if a.cmd == "up":
            t0 = time.monotonic()
            inv = lab.up(a.fleet, a.subnet)
            print(f"lab: {len(lab.hosts)} host(s) up in {time.monotonic() - t0:.1f} s; "
                  f"key {lab.key}, known_hosts {lab.known_hosts}", file=sys.stderr)
            print(inv)
        elif a.cmd == "down":
            lab.down()
            print("lab: down", file=sys.stderr)
        else:
            rows = lab.status()
            if not rows:
                print("lab: no lab is up")
            for r in rows:
                print(f"{r['name']}\t{r['address']}\t{r['role']}\tsshd {r['sshd']}")
    except LabError as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
