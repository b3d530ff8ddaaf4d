# gpuk8s fact probe: read-only, POSIX sh, one run per host. Every section is framed by
# markers so the parser can split them; nothing here changes the host.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
exec 4>&1
T=""; command -v timeout >/dev/null 2>&1 && T="timeout 20"
# sec NAME CMD...: CMD, cut off after 20 s (a hung nvidia-smi, systemctl or runtime must not stop the
# others). quick NAME CMD...: the same without the timeout, for commands that only read local files or
# the kernel and cannot hang (a timeout costs a process per section).
sec() { _t=$T; _sec "$@"; }
quick() { _t=; _sec "$@"; }
_sec() {
  name=$1; shift
  printf '@@gpuk8s-begin %s\n' "$name"
  # At most 256 KiB of a section reach the client, so one runaway command cannot crowd out the others.
  # Its exit status comes back on fd 3; a command cut off by head ends with SIGPIPE (141).
  if command -v "$1" >/dev/null 2>&1; then
    rc=$( { { $_t "$@" 2>&1 3>&- 4>&-; echo $? >&3; } | head -c 262144 >&4; } 3>&1 ); rc=${rc:-1}
  else echo "$1: command not found"; rc=127; fi
  printf '\n@@gpuk8s-end %s %s\n' "$name" "$rc"
}
file() { quick "$1" cat "$2"; }
quick uid id -u
quick hostname hostname
file os-release /etc/os-release
quick kernel uname -r
quick arch uname -m
quick nproc nproc
file meminfo /proc/meminfo
quick swap swapon --show --noheadings --raw
quick lsmod lsmod
quick sysctl sysctl net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
sec nvidia-smi nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current --format=csv,noheader,nounits
# A hung driver: the first nvidia-smi ran into its timeout (124). Each later call would wait as long, and the
# whole probe is cut off at 120 s (preflight/runner.py), losing every fact: the later calls are not made.
hung=; [ "$rc" = 124 ] && hung="nvidia-smi: not run: the first nvidia-smi call timed out after 20 s"
smi() { if [ -n "$hung" ]; then echo "$hung"; return 124; fi; $T nvidia-smi "$@"; }
smiversion() { smi --version; }
quick nvidia-smi-version smiversion
# compute capability per GPU (drivers before R510 do not know the field); at most 4 KiB: the output of the
# whole probe is bounded (remote.MAX_OUTPUT), and a runaway nvidia-smi already fills two sections above
computecap() { smi --query-gpu=compute_cap --format=csv,noheader 2>&1 | head -c 4096; }
quick nvidia-smi-cc computecap
# MIG per GPU (gpuk8s/facts/mig.py), in sub-sections '@@mig NAME RC': the modes; where a GPU is (or is to
# be) in MIG mode its profiles and GPU and compute instances; the processes holding each GPU.
mig() {
  command -v nvidia-smi >/dev/null 2>&1 || { echo "nvidia-smi: command not found"; return 127; }
  q=$(smi --query-gpu=index,uuid,mig.mode.current,mig.mode.pending --format=csv,noheader 2>&1); rc=$?
  printf '@@mig mode %s\n%s\n' "$rc" "$q"
  case $q in *Enabled*) for l in lgip lgi lci; do
    o=$(smi mig -$l 2>&1); printf '@@mig %s %s\n%s\n' "$l" "$?" "$o"; done;; esac
  o=$(smi --query-compute-apps=gpu_uuid,pid,process_name --format=csv,noheader 2>&1)
  printf '@@mig apps %s\n%s\n' "$?" "$o"
}
quick mig mig
file nvidia-proc /proc/driver/nvidia/version
# The driver beyond nvidia-smi (gpuk8s/facts/driver.py), in sub-sections '@@drv NAME RC' (bounded together by the
# section's 256 KiB):
# the NVIDIA PCI devices (GPUs, NVSwitches: readable without a driver), the NVML libraries installed (their
# version against the loaded module's: a mismatch), the module on disk (what a reboot loads) and its signer,
# Secure Boot, kernel headers, fabric manager and persistenced, the driver packages and their holds, nouveau's
# blacklist.
drvsub() { n=$1; shift; o=$("$@" 2>&1); r=$?; printf '@@drv %s %s\n%s\n' "$n" "$r" "$o"; }
nvml() { for f in /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* /usr/lib/aarch64-linux-gnu/libnvidia-ml.so.*; do [ -e "$f" ] && echo "${f##*/}"; done; true; }
headers() { if [ -d "/lib/modules/$(uname -r)/build" ]; then echo yes; else echo no; fi; }
units() { $T systemctl is-active nvidia-fabricmanager nvidia-persistenced; true; }
blacklist() { grep -ls '^[[:space:]]*blacklist[[:space:]]\{1,\}nouveau' /etc/modprobe.d/*.conf /lib/modprobe.d/*.conf /usr/lib/modprobe.d/*.conf; true; }
# the RHEL family (Alibaba Cloud Linux: ID_LIKE="rhel fedora centos anolis") keeps packages in rpm and holds in dnf's
# versionlock list; the Debian family in dpkg and apt-mark (decided by os-release, not by which tools exist)
rpmos() { grep -qsE '^(ID|ID_LIKE)=.*(rhel|fedora|centos)' /etc/os-release; }
drvpkgs() { if rpmos; then
    rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\n' 'nvidia-driver*' 'nvidia-open' 'nvidia-fabric*' 'kmod-nvidia*' 2>/dev/null
  else dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\n' 'nvidia-driver-*' 'nvidia-headless-no-dkms-*' \
      'nvidia-utils-*' 'nvidia-fabricmanager*' 'linux-modules-nvidia-*' 'nvidia-dkms-*' 'libnvidia-nscq*' 2>/dev/null |
      awk '$3 ~ /^ii/ {print $1, $2}'; fi; true; }
holds() { if rpmos; then cat /etc/dnf/plugins/versionlock.list 2>/dev/null; else apt-mark showhold; fi; true; }
driver() {
  if command -v lspci >/dev/null 2>&1; then drvsub lspci lspci -Dnn -d 10de:; else printf '@@drv lspci 127\n'; fi
  drvsub nvml nvml
  if command -v modinfo >/dev/null 2>&1; then drvsub modinfo modinfo nvidia; else printf '@@drv modinfo 127\n'; fi
  if command -v mokutil >/dev/null 2>&1; then drvsub secureboot mokutil --sb-state; else printf '@@drv secureboot 127\n'; fi
  drvsub headers headers
  drvsub units units
  drvsub packages drvpkgs
  drvsub holds holds
  drvsub blacklist blacklist
}
quick driver driver
# The RDMA ports (gpuk8s/facts/fabric.py, issue 43) as the kernel shows them in sysfs, printed the way infiniband-
# diags' ibstatus prints the same files (its script reads them too): no tool needed, nothing but files read.
rdmaval() { v=; read -r v 2>/dev/null < "$2"; printf '\t%s:\t %s\n' "$1" "$v"; }
rdma() { for p in /sys/class/infiniband/*/ports/*; do [ -d "$p" ] || continue; d=${p%/ports/*}
  printf "Infiniband device '%s' port %s status:\n" "${d##*/}" "${p##*/}"
  rdmaval 'sm lid' "$p/sm_lid"; rdmaval state "$p/state"; rdmaval 'phys state' "$p/phys_state"
  rdmaval rate "$p/rate"; rdmaval link_layer "$p/link_layer"; echo; done; true; }
quick rdma rdma
# RoCE ports' GID tables as MLNX_OFED's show_gids prints them (DEV PORT INDEX GID IPv4 VER DEV, tabs): the kernel's
# gids/N, gid_attrs/types/N ("IB/RoCE v1" or "RoCE v2", drivers/infiniband/core/cache.c gid_type_str) and
# gid_attrs/ndevs/N; an empty slot's type cannot be read (EINVAL) and is skipped, as show_gids skips it
gids() { for p in /sys/class/infiniband/*/ports/*; do [ -d "$p/gid_attrs/types" ] || continue; d=${p%/ports/*}
  l=; read -r l 2>/dev/null < "$p/link_layer"; [ "$l" = Ethernet ] || continue
  for t in "$p"/gid_attrs/types/*; do i=${t##*/}; v=; read -r v 2>/dev/null < "$t" || continue
    g=; read -r g 2>/dev/null < "$p/gids/$i"; n=; read -r n 2>/dev/null < "$p/gid_attrs/ndevs/$i"
    case $v in "RoCE v2") v=v2;; *) v=v1;; esac; a=${g#0000:0000:0000:0000:0000:ffff:}; h=${a%%:*}; o=${a#*:}
    if [ "$a" = "$g" ]; then a=; else a=$(printf '%d.%d.%d.%d' "0x${h%??}" "0x${h#??}" "0x${o%??}" "0x${o#??}"); fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${d##*/}" "${p##*/}" "$i" "$g" "$a" "$v" "$n"
  done; done; true; }
quick gids gids
# the MTU of each RoCE GID's network interface (the kernel derives the RoCE path MTU from it), printed as
# `grep -H . /sys/class/net/NAME/mtu` prints it; a name is the kernel's (no '/'), read from sysfs, never a path given
netmtu() { for n in /sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*; do v=; read -r v 2>/dev/null < "$n" || continue
    case $v in ''|*/*|.*) continue;; esac; m=; read -r m 2>/dev/null < "/sys/class/net/$v/mtu" || continue
    printf '/sys/class/net/%s/mtu:%s\n' "$v" "$m"; done; true; }
quick netmtu netmtu
# how each GPU reaches each NIC (PCIe switch, host bridge, socket): only where gpuk8s asks (GK_FABRIC: the host's
# inventory sets fabric:), nvidia-smi topo takes a while on a large board
topo() { smi topo -m; }
[ -z "${GK_FABRIC:-}" ] || quick topo topo
# PCIe Access Control Services on the bridges (NCCL's troubleshooting guide: ACS redirecting peer-to-peer traffic to
# the root complex cuts GPUDirect's bandwidth or hangs it): lspci -vvv as root (its extended capabilities), only the
# devices' header lines and ACSCtl lines kept; only where gpuk8s asks (GK_FABRIC), lspci -vvv reads every device
acs() { command -v lspci >/dev/null 2>&1 || { echo 'lspci: not found'; return 127; }
  lspci -vvv 2>/dev/null | grep -E '^[0-9a-f]|ACSCtl|access denied'; true; }
[ -z "${GK_FABRIC:-}" ] || quick acs acs
sec containerd-version containerd --version
sec containerd-active systemctl is-active containerd
file containerd-config /etc/containerd/config.toml
# Each drop-in is framed by a line '@@file PATH' (no TOML file holds such a line), so that each is parsed
# on its own: files concatenated may define the same table twice.
dropins() { for f in /etc/containerd/conf.d/*.toml; do [ -f "$f" ] || continue; printf '@@file %s\n' "$f"; cat "$f" 2>/dev/null; echo; done; true; }
quick containerd-dropins dropins
# nvidia-ctk 1.18.0 wrote its drop-in to config.d/ instead of conf.d/ (toolkit issue 1404): list what is there
configd() { for f in /etc/containerd/config.d/*.toml; do [ -f "$f" ] && echo "$f"; done; true; }
quick containerd-configd configd
# cgroup2fs on cgroup v2, tmpfs on v1 or hybrid (kubernetes.io "Identify the cgroup version on Linux nodes")
quick cgroupfs stat -fc %T /sys/fs/cgroup/
sec docker-version docker version --format '{{.Server.Version}}'
sec docker-active systemctl is-active docker
file docker-daemon /etc/docker/daemon.json
sec nvidia-ctk nvidia-ctk --version
sec kubeadm kubeadm version -o short
sec kubelet kubelet --version
sec firewalld systemctl is-active firewalld
# (quick runs a shell function like these in the section's subshell: no sh to start)
tools() { for t in conntrack socat ebtables ethtool iptables ip; do command -v "$t" >/dev/null 2>&1 && echo "$t"; done; true; }
quick tools tools
sec listening ss -Htln
quick links ip -o link show
file product-uuid /sys/class/dmi/id/product_uuid
file machine-id /etc/machine-id
kube_files() { ls /etc/kubernetes/admin.conf /etc/kubernetes/kubelet.conf 2>/dev/null; true; }
quick kube-files kube_files
quick time date +%s.%N
# sources: each URL of $GK_SOURCES (set by gpuk8s in front of this script: the package repositories, image
# registries and CNI manifest the inventory names, gpuk8s/mirrors.py sources), asked once, all at the same time,
# with short timeouts: "CURL_EXIT HTTP_CODE URL" per line. Any HTTP answer counts as reached (a registry's /v2/
# answers 401 without credentials); curl is not told about proxies apt or containerd may be configured with.
sources() { set -f; for u in $GK_SOURCES; do
  ( c=$(curl -sS -o /dev/null --connect-timeout 3 -m 6 -w '%{http_code}' "$u" 2>/dev/null); echo "$? ${c:-000} $u" ) &
done; wait; }
[ -z "${GK_SOURCES:-}" ] || quick sources sources
