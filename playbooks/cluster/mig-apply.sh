# MIG on this host (gpuk8s/phases/mig.py, docs/mig.md), as root:
# 1. the layout for boot: /etc/gpuk8s/mig.conf, the program /usr/local/sbin/gpuk8s-mig and the oneshot unit
#    gpuk8s-mig.service, enabled (GPU and compute instances do not survive a reboot); removed with MIG off;
# 2. on each GPU that differs from the layout, the commands of gpuk8s's diff, in order: destroy the compute
#    and GPU instances, set the MIG mode, reset the GPU where the mode is still pending, create the instances.
# One line per result: "@@gpuk8s-mig files changed|unchanged" and "@@gpuk8s-mig gpu INDEX STATUS DETAIL",
# STATUS changed, needs-reboot (the reset was refused) or failed.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
umask 022
files=unchanged
gk_put() {  # PATH MODE CONTENT: write the file when its content differs
  if [ -f "$1" ] && printf '%s' "$3" | cmp -s - "$1"; then return 0; fi
  mkdir -p "$(dirname "$1")" && printf '%s' "$3" > "$1.gpuk8s-tmp" && chmod "$2" "$1.gpuk8s-tmp" &&
    mv -f "$1.gpuk8s-tmp" "$1" && files=changed
}
gk_line() { printf '%s' "$1" | tr '\n' ' ' | cut -c1-400; }
gk_modes() { nvidia-smi -i "$1" --query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader | tr -d ' '; }
unit=/etc/systemd/system/gpuk8s-mig.service
if [ {{ persist }} = yes ]; then
  gk_put /etc/gpuk8s/mig.conf 0644 {{ conf }} || exit 1
  gk_put /usr/local/sbin/gpuk8s-mig 0755 {{ program }} || exit 1
  gk_put "$unit" 0644 {{ unit }} || exit 1
  if [ "$files" = changed ]; then systemctl daemon-reload; fi
  systemctl is-enabled -q gpuk8s-mig 2>/dev/null || { systemctl enable gpuk8s-mig >/dev/null 2>&1 && files=changed; }
elif [ -f "$unit" ]; then
  systemctl disable gpuk8s-mig >/dev/null 2>&1
  rm -f "$unit" /etc/gpuk8s/mig.conf /usr/local/sbin/gpuk8s-mig && systemctl daemon-reload
  files=changed
fi
echo "@@gpuk8s-mig files $files"
gk_gpu() {  # INDEX MODE(0|1|-) DESTROY(yes|no) PROFILES(list|-)
  i=$1
  if [ "$3" = yes ]; then
    for w in dci dgi; do
      out=$(nvidia-smi mig -i "$i" -$w 2>&1) || case $out in
        *"No compute instances found"*|*"No GPU instances found"*) ;;
        *) echo "@@gpuk8s-mig gpu $i failed nvidia-smi mig -$w: $(gk_line "$out")"; return;;
      esac
    done
  fi
  if [ "$2" != - ]; then
    out=$(nvidia-smi -i "$i" -mig "$2" 2>&1) || { echo "@@gpuk8s-mig gpu $i failed nvidia-smi -mig $2: $(gk_line "$out")"; return; }
    m=$(gk_modes "$i")
    if [ "${m%,*}" != "${m#*,}" ]; then
      out=$(nvidia-smi -i "$i" -r 2>&1) || { echo "@@gpuk8s-mig gpu $i needs-reboot $(gk_line "$out")"; return; }
    fi
  fi
  if [ "$4" != - ]; then
    out=$(nvidia-smi mig -i "$i" -cgi "$4" -C 2>&1) || { echo "@@gpuk8s-mig gpu $i failed nvidia-smi mig -cgi: $(gk_line "$out")"; return; }
  fi
  echo "@@gpuk8s-mig gpu $i changed"
}
{% for c in changes %}gk_gpu {{ c.index }} {{ c.mode }} {{ c.destroy }} {{ c.create }}
{% endfor %}true
