"""make bench: time gpuk8s preflight (facts only, then with the network test) and gpuk8s install (first run,
then the no-op re-run) on lab fleets of 32 and 128 hosts.

Prints wall time per run and the median; also the floor: one plain OpenSSH login + `true` per host,
run with the same concurrency. Speed is shown here, never asserted by a test.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.lab.lab import Lab


def gpuk8s(*args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "gpuk8s", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def ssh_floor(lab: Lab, concurrency: int) -> float:
    def one(h):
        subprocess.run(["ssh", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
                        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"gpuk8s@{h.address}", "true"],
                       capture_output=True)

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, lab.hosts.values()))
    return time.monotonic() - t0


def main() -> None:
    lab = Lab()
    try:
        for n in (32, 128):
            fleet = Path(tempfile.mkdtemp()) / "fleet.yaml"
            fleet.write_text(f"hosts:\n  - name: cp\n    role: control-plane\n  - name: w\n    count: {n - 1}\n")
            t0 = time.monotonic()
            lab.up(fleet)
            up = time.monotonic() - t0
            inv = str(lab.inventory)
            runs = [gpuk8s("preflight", "-i", inv, "--no-network", "-o", "json") for _ in range(3)]
            net = gpuk8s("preflight", "-i", inv, "-o", "json", "--network-seconds", "0")
            floor = ssh_floor(lab, 16)
            print(f"{n:4d} hosts: lab up {up:5.1f} s | preflight facts+checks median {statistics.median(runs):5.1f} s "
                  f"(runs {', '.join(f'{r:.1f}' for r in runs)}) | with RTT matrix {net:5.1f} s | "
                  f"floor (ssh login + true, 16 at a time) {floor:5.1f} s", flush=True)
            kc = str(lab.root / "admin.kubeconfig")
            first = gpuk8s("install", "-i", inv, "-o", "json", "--kubeconfig-out", kc)
            again = gpuk8s("install", "-i", inv, "-o", "json", "--kubeconfig-out", kc)
            print(f"{n:4d} hosts: install (prepare, kubeadm, join, verify) first run {first:5.1f} s | "
                  f"re-run, nothing to change "
                  f"{again:5.1f} s", flush=True)
    finally:
        lab.down()


if __name__ == "__main__":
    main()
