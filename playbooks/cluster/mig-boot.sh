#!/bin/sh
# gpuk8s-mig: re-create the MIG layout of /etc/gpuk8s/mig.conf, written by gpuk8s (docs/mig.md). The MIG
# mode survives a reboot; GPU and compute instances do not. gpuk8s-mig.service runs this once at boot,
# before the kubelet, so that the device plugin finds the MIG devices when it starts. Each line of the
# file: "INDEX on PROFILE,PROFILE,..." (in creation order) or "INDEX off". Logs go to the journal.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
conf=${1:-/etc/gpuk8s/mig.conf}
[ -r "$conf" ] || { echo "gpuk8s-mig: $conf: no such file" >&2; exit 1; }
modes() { nvidia-smi -i "$1" --query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader | tr -d ' '; }
rc=0
while read -r i want list; do
  case $i in ''|'#'*) continue;; esac
  m=$(modes "$i") || { echo "gpuk8s-mig: GPU $i: cannot read its MIG mode" >&2; rc=1; continue; }
  if [ "$want" = on ]; then
    [ "${m#*,}" = Enabled ] || nvidia-smi -i "$i" -mig 1 || { rc=1; continue; }
    m=$(modes "$i")
    if [ "${m%,*}" != Enabled ]; then
      nvidia-smi -i "$i" -r || { echo "gpuk8s-mig: GPU $i: MIG mode pending and the reset refused: reboot" >&2; rc=1; continue; }
    fi
    if ! nvidia-smi mig -i "$i" -lgi 2>/dev/null | grep -q ' MIG '; then
      nvidia-smi mig -i "$i" -cgi "$list" -C || rc=1
    fi
  elif [ "${m%,*}" = Enabled ] || [ "${m#*,}" = Enabled ]; then
    nvidia-smi mig -i "$i" -dci >/dev/null 2>&1
    nvidia-smi mig -i "$i" -dgi >/dev/null 2>&1
    nvidia-smi -i "$i" -mig 0 || { rc=1; continue; }
    m=$(modes "$i")
    [ "${m%,*}" = "${m#*,}" ] || nvidia-smi -i "$i" -r || rc=1
  fi
done < "$conf"
exit $rc
