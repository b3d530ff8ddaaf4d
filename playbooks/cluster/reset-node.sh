# gpuk8s reset on one host: kubeadm reset -f, then what kubeadm says it leaves behind ("The reset process does
# not clean CNI configuration ... iptables rules or IPVS tables ... your kubeconfig files", kubeadm's reset.go),
# then the kubelet stopped and disabled. Every step is idempotent: a second run finds nothing to do.
# Only what Kubernetes, Calico and Flannel wrote goes: another CNI user's files (podman), another etcd (Ubuntu's
# etcd-server on a worker), volumes still mounted under /var/lib/kubelet, other clusters' kubeconfigs stay.
gk_kubeadm_lock
control_plane={{ control_plane }}
kept=/var/lib/gpuk8s/etcd-member-kept
if [ "$control_plane" = yes ] && [ -e "$kept" ]; then
  echo "an earlier reset could not remove this control plane's etcd member ($kept)"
  echo "@@gpuk8s-etcd-member-kept"
  exit 0
fi
# the etcd data directory of kubeadm's stacked etcd, read where kubeadm reset reads it (the static pod's
# --data-dir in manifest $1), before kubeadm reset removes the manifest; on a control plane only. Printed, and
# 0, only when it lies below /var/lib and is etcd's (named etcd*, or holding etcd's member/; kubeadm's default,
# /var/lib/etcd, when none is named): any other path (/, /home, /var/lib/dpkg, one with . or ..) is printed with
# status 1 and is never removed. Only root writes the manifest:
# defence in depth against a hand-edited or planted one.
gk_etcd_data_dir() {
  d=$(sed -n 's/^[[:space:]]*-[[:space:]]*--data-dir=//p' "$1" 2>/dev/null | head -n 1)
  case "$d" in /*) ;; *) d=/var/lib/etcd ;; esac
  while [ "$d" != / ] && [ "${d%/}" != "$d" ]; do d=${d%/}; done
  printf '%s\n' "$d"
  case "$d/" in */../*|*/./*|*//*) return 1 ;; esac
  # an etcd-named directory, or one that holds etcd's data (member/): not /var/lib/dpkg or /var/lib/containerd
  case "$d" in
    /var/lib/etcd|/var/lib/etcd[-_.0-9]*) return 0 ;;
    /var/lib/?*) [ -d "$d/member" ] && return 0 ;;
  esac
  return 1
}
etcd_manifest=/etc/kubernetes/manifests/etcd.yaml
etcd_dir=
etcd_refused=
member=
if [ "$control_plane" = yes ]; then
  [ -e "$etcd_manifest" ] && member=1
  etcd_dir=$(gk_etcd_data_dir "$etcd_manifest") || { etcd_refused=$etcd_dir; etcd_dir=; }
fi
failed=
if command -v kubeadm >/dev/null 2>&1; then
  # the socket named, as at init/join: with cri-dockerd and containerd both present kubeadm would not choose
  out=$(gk_to_the_end kubeadm-reset kubeadm reset -f --cri-socket {{ cri_socket }}) || failed=$?
  printf '%s\n' "$out"
  [ -z "$failed" ] || echo "@@gpuk8s-kubeadm-reset-failed $failed"
elif [ -n "$member" ]; then
  failed=127
fi
# kubeadm reset only warns when it cannot remove the etcd member ("[reset] Failed to remove etcd member: ...,
# please manually remove this etcd member using etcdctl", removeetcdmember.go) and then keeps the data directory:
# the member is still in etcd, so this host keeps its etcd data and its Node, and the reset stops here
if [ -n "$member" ] && { [ -n "$failed" ] || printf '%s\n' "$out" | grep -qi 'failed to remove etcd member'; }; then
  mkdir -p /var/lib/gpuk8s && : > "$kept"
  echo "@@gpuk8s-etcd-member-kept"
  exit 0
fi
if systemctl cat kubelet.service >/dev/null 2>&1 || systemctl is-enabled -q kubelet 2>/dev/null; then
  systemctl stop kubelet 2>/dev/null
  systemctl disable kubelet 2>/dev/null
fi
# the CNI's configuration and state: the files Calico and Flannel write (another CNI user's networks stay)
rm -f /etc/cni/net.d/10-calico.conflist /etc/cni/net.d/calico-kubeconfig /etc/cni/net.d/10-flannel.conflist
rm -rf /var/lib/cni/networks/k8s-pod-network /var/lib/cni/networks/cbr0 /var/lib/cni/flannel \
  /var/lib/calico /run/calico /run/flannel
rm -f /var/lib/cni/results/k8s-pod-network-* /var/lib/cni/results/cbr0-*
for d in /etc/cni/net.d /etc/cni /var/lib/cni/networks /var/lib/cni/results /var/lib/cni; do
  rmdir "$d" 2>/dev/null
done
for i in cni0 flannel.1 tunl0 vxlan.calico vxlan-v6.calico kube-ipvs0 $(ls /sys/class/net 2>/dev/null | grep '^cali'); do
  if [ -e "/sys/class/net/$i" ]; then ip link delete "$i" 2>/dev/null && echo "removed interface $i"; fi
done
# only the rules of kube-proxy and the CNI (chains KUBE-*, cali-*, FLANNEL-*): the host's own rules stay
for t in iptables ip6tables; do
  command -v "$t-save" >/dev/null 2>&1 && command -v "$t-restore" >/dev/null 2>&1 || continue
  if "$t-save" 2>/dev/null | grep -Eq '(KUBE-|cali-|FLANNEL-)'; then
    "$t-save" | grep -Ev '(KUBE-|cali-|FLANNEL-)' | "$t-restore" && echo "removed the Kubernetes rules of $t"
  fi
done
if command -v ipvsadm >/dev/null 2>&1 && [ -n "$(ipvsadm -Ln 2>/dev/null | sed -n '4p')" ] && [ -e /sys/class/net/kube-ipvs0 ]; then
  ipvsadm --clear && echo "cleared the IPVS tables of kube-proxy"
fi
# pod volumes still mounted under /var/lib/kubelet (kubeadm reset unmounts them; it may have failed or be gone):
# unmounted deepest first, and never deleted through (an NFS or CSI volume holds the user's data)
gk_kubelet_mounts() { awk '{print $2}' /proc/mounts | grep '^/var/lib/kubelet/' | sort -r; }
for m in $(gk_kubelet_mounts); do
  umount "$(printf '%b' "$m")" 2>/dev/null && echo "unmounted $(printf '%b' "$m")"
done
left=$(gk_kubelet_mounts)
if [ -n "$left" ]; then
  echo "still mounted under /var/lib/kubelet (in use?), not deleted: $(echo $left)" >&2
  exit 1
fi
rm -rf --one-file-system /var/lib/kubelet /etc/kubernetes
if [ -n "$etcd_dir" ] && [ -d "$etcd_dir" ]; then rm -rf --one-file-system "$etcd_dir"; fi
if [ -n "$etcd_refused" ]; then
  echo "not removed: etcd's --data-dir $etcd_refused ($etcd_manifest) is not below /var/lib" >&2
  echo "@@gpuk8s-etcd-dir-refused $etcd_refused"
fi
# kubeconfigs on the host (root's and the login user's) whose only cluster is this one; kept aside, 0600
want={{ 'server: https://' ~ endpoint }}
for home in /root $(getent passwd {{ user }} | cut -d: -f6); do
  f="$home/.kube/config"
  [ -f "$f" ] || continue
  awk -v want="$want" '{ sub(/^[ \t]+/, ""); sub(/[ \t\r]+$/, "") }
      /^server:/ { n++; if ($0 == want) m++ } END { if (m == 0) exit 1; exit (n == 1 ? 0 : 2) }' "$f"
  case $? in
    0) mv -f "$f" "$f.gpuk8s-reset.bak" && chmod 600 "$f.gpuk8s-reset.bak" &&
         echo "removed $f (kept as $f.gpuk8s-reset.bak)" ;;
    2) echo "kept $f: it names other clusters too (kubectl config delete-cluster removes this one)" ;;
  esac
done
rm -f /var/lib/gpuk8s/restart-kubelet
echo "@@gpuk8s-reset-done"
