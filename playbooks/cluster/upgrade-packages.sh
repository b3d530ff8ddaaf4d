# gpuk8s upgrade on one host: the named Kubernetes packages (kubeadm; or kubelet and kubectl) of the target
# minor, from that minor's pkgs.k8s.io repository (switched by the upgrade's prepare phase), installed and held
# again as install pins them (playbooks/kubernetes-prerequisites.yaml). A package already at the minor is left
# alone. With restart (the node is drained), the kubelet restarts every time, also when its package was
# installed by an earlier, interrupted run: a kubelet still running the old binary would stay old for good.
minor={{ minor }}
# the package manager: the OS family of the host's facts (debian or rhel), else whichever the host has
family={{ family }}
if [ -z "$family" ]; then
  if command -v apt-get >/dev/null 2>&1; then family=debian; else family=rhel; fi
fi
todo=
all=
for p in {% for p in packages %}{{ p }} {% endfor %}; do
  all="$all $p"
  if [ "$family" = debian ]; then
    v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null)
  else
    v=$(rpm -q --qf '%{VERSION}' "$p" 2>/dev/null)
  fi
  case "$v" in "$minor".*) ;; *) todo="$todo $p" ;; esac
done
if [ -n "$todo" ]; then
  if [ "$family" = debian ]; then
    set --
    for p in $todo; do set -- "$@" "$p=$minor.*"; done
    apt-get -q -o DPkg::Lock::Timeout={{ lock_timeout }} update >/dev/null || exit 1
    apt-get -q -y -o DPkg::Lock::Timeout={{ lock_timeout }} install --allow-change-held-packages "$@" || exit 1
  else
    set --
    for p in $todo; do set -- "$@" "$p-$minor.*"; done
    dnf install -y -q --disableexcludes=kubernetes "$@" || exit 1
  fi
  echo "@@gpuk8s-upgraded$todo"
fi
if [ "$family" = debian ]; then
  # $all: names from gpuk8s's fixed set (gpuk8s/phases/upgrade.py _package_list), one word each
  apt-mark hold $all >/dev/null || exit 1
fi
if [ {{ restart }} = yes ]; then
  systemctl daemon-reload && systemctl restart kubelet || exit 1
fi
echo "@@gpuk8s-packages-done"
