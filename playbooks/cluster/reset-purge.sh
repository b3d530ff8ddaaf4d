# gpuk8s reset --purge on one host (after reset-node): the Kubernetes packages gpuk8s installed, the NVIDIA
# container toolkit where gpuk8s added its repository, the repository files and keys gpuk8s wrote, and every
# file gpuk8s changed restored from /var/lib/gpuk8s/backup (PATH: the original; PATH.absent: there was none);
# a file changed since is kept beside it as PATH.gpuk8s-purge.bak (same mode) before the original comes back.
# containerd.io, where gpuk8s installed it in place of the distribution's containerd, stays (a host needs a
# runtime), and so does the configuration it reads, less the NVIDIA runtime when the toolkit goes.
b=/var/lib/gpuk8s/backup
k8s="kubelet kubeadm kubectl kubernetes-cni cri-tools"
tk="nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1"
. /etc/os-release 2>/dev/null
case " $ID $ID_LIKE " in
  *" debian "*|*" ubuntu "*) family=debian ;;
  *) family=rhel ;;
esac
ours() { [ -e "$b$1.absent" ]; }  # a file that gpuk8s created (there was none before)
pkgs=$k8s
toolkit_repo=
if ours /etc/apt/sources.list.d/nvidia-container-toolkit.list || ours /etc/yum.repos.d/nvidia-container-toolkit.repo; then
  pkgs="$pkgs $tk"
  toolkit_repo=1
fi
keep_runtime=
if ours /etc/apt/sources.list.d/gpuk8s-docker.list || ours /etc/yum.repos.d/gpuk8s-docker.repo; then
  keep_runtime=1
fi
if [ "$family" = debian ]; then
  installed=$(for p in $pkgs; do dpkg-query -W -f='${Package}\n' "$p" 2>/dev/null; done)
  if [ -n "$installed" ]; then
    apt-mark unhold $installed >/dev/null
    apt-get -q -y -o DPkg::Lock::Timeout={{ lock_timeout }} purge $installed || exit 1
    echo "removed packages: $(echo $installed)"
  fi
else
  installed=$(for p in $pkgs; do rpm -q --qf '%{NAME}\n' "$p" 2>/dev/null | grep -v 'is not installed'; done)
  if [ -n "$installed" ]; then
    dnf remove -y -q $installed || exit 1
    echo "removed packages: $(echo $installed)"
  fi
fi
restarted=
if [ -d "$b" ]; then
  for saved in $(cd "$b" && find . -type f | sed 's#^\.##' | sort); do
    case "$saved" in
      *.tmp) continue ;;
      *.absent) target=${saved%.absent} ;;
      *) target=$saved ;;
    esac
    case "$target" in
      /etc/apt/sources.list.d/gpuk8s-docker.list|/etc/yum.repos.d/gpuk8s-docker.repo)
        if [ -n "$keep_runtime" ]; then echo "kept $target (the repository of the containerd.io gpuk8s installed)"; continue; fi ;;
      /etc/containerd/*|/etc/docker/daemon.json)
        if [ -n "$keep_runtime" ]; then echo "kept $target (containerd was upgraded by gpuk8s)"; continue; fi
        restarted="$restarted ${target#/etc/}" ;;
    esac
    if [ "$saved" != "$target" ]; then
      if [ -e "$target" ] || [ -L "$target" ]; then rm -f "$target" && echo "removed $target"; fi
    else
      if [ -f "$target" ] && ! cmp -s "$b$saved" "$target"; then
        cp -p "$target" "$target.gpuk8s-purge.bak" && echo "kept the current $target as $target.gpuk8s-purge.bak" || exit 1
      fi
      t=$(mktemp "$(dirname "$target")/.gpuk8s.XXXXXX") || exit 1
      cp -p "$b$saved" "$t" && mv -f "$t" "$target" && echo "restored $target" || { rm -f "$t"; exit 1; }
    fi
  done
fi
# the runtime stays, the toolkit goes: nvidia must not stay the default runtime, or creating any container fails
# (its nvidia-container-runtime binary is gone)
if [ -n "$keep_runtime" ] && [ -n "$toolkit_repo" ]; then
  if [ -e /etc/containerd/conf.d/99-nvidia.toml ]; then
    rm -f /etc/containerd/conf.d/99-nvidia.toml && echo "removed /etc/containerd/conf.d/99-nvidia.toml (the toolkit's drop-in)"
    restarted="$restarted containerd"
  fi
  q="[\"']"
  if grep -Eq "^[[:space:]]*default_runtime_name[[:space:]]*=[[:space:]]*${q}nvidia${q}" /etc/containerd/config.toml 2>/dev/null; then
    sed -i -E "s/^([[:space:]]*default_runtime_name[[:space:]]*=[[:space:]]*)${q}nvidia${q}/\1\"runc\"/" /etc/containerd/config.toml &&
      echo "set containerd's default runtime back to runc in /etc/containerd/config.toml"
    restarted="$restarted containerd"
  fi
  if grep -Eq '"default-runtime"[[:space:]]*:[[:space:]]*"nvidia"' /etc/docker/daemon.json 2>/dev/null; then
    sed -i -E 's/("default-runtime"[[:space:]]*:[[:space:]]*)"nvidia"/\1"runc"/' /etc/docker/daemon.json &&
      echo "set Docker's default runtime back to runc in /etc/docker/daemon.json"
    restarted="$restarted docker"
  fi
fi
# the signing keys gpuk8s fetched for the repositories it added (they are not in the backup: written whole)
if ours /etc/apt/sources.list.d/kubernetes.list || ours /etc/yum.repos.d/kubernetes.repo; then
  rm -f /etc/apt/keyrings/kubernetes-apt-keyring.gpg /etc/pki/rpm-gpg/gpuk8s-kubernetes.asc
fi
if [ -n "$toolkit_repo" ]; then
  rm -f /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg /etc/pki/rpm-gpg/gpuk8s-nvidia-container-toolkit.asc
fi
[ -n "$keep_runtime" ] || rm -f /usr/share/keyrings/gpuk8s-docker.gpg /etc/pki/rpm-gpg/gpuk8s-docker.asc
rm -rf "$b"
rmdir /etc/containerd/conf.d 2>/dev/null
rm -f /var/lib/gpuk8s/restart-containerd /var/lib/gpuk8s/restart-docker
# the bundles gpuk8s copied here to serve (install --bundle; a server kept with --keep-serving ends with them), and
# the copies of the sources a run from a bundle keeps (a hosts.toml may hold a mirror's credentials)
rm -rf /var/lib/gpuk8s/bundle /var/lib/gpuk8s/bundle-sources
case "$restarted" in *containerd*) systemctl is-active -q containerd && systemctl restart containerd && echo "restarted containerd" ;; esac
case "$restarted" in *docker*) systemctl is-active -q docker && systemctl restart docker && echo "restarted docker" ;; esac
echo "@@gpuk8s-purge-done"
