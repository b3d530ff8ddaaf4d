# Helpers of the cluster phases' remote commands (gpuk8s sends them ahead of each command).
# gk_secret_file PATH SIZE: stdin into a 0600 file of this run, whole (SIZE bytes) or not at all; the
#   file is removed when the command ends, also when gpuk8s has gone away.
gk_secret_file() {
  umask 077
  gk_f=$1
  mkdir -p "$(dirname "$gk_f")" || exit 1
  trap 'rm -f "$gk_f"' EXIT
  trap 'rm -f "$gk_f"; exit 130' INT
  trap 'rm -f "$gk_f"; exit 143' TERM
  # a dropped connection (sudo's pty closing) must not stop kubeadm half-way: it finishes, then the file goes
  trap '' HUP
  head -c "$2" > "$gk_f" && [ "$(wc -c < "$gk_f")" -eq "$2" ] || { echo "the configuration did not arrive whole" >&2; exit 1; }
}
# gk_to_the_end NAME COMMAND...: COMMAND writes to a file of this run, not to the SSH channel, so it finishes
#   even if gpuk8s goes away (a kubeadm killed by SIGPIPE half-way needs kubeadm reset); the file is unlinked
#   before it is printed, so a reader that went away cannot leave it (kubeadm init prints the join token).
gk_to_the_end() {
  mkdir -p /var/lib/gpuk8s && gk_out=$(mktemp /var/lib/gpuk8s/"$1".XXXXXXXXXX) || exit 1
  shift
  "$@" > "$gk_out" 2>&1 </dev/null
  gk_rc=$?
  exec 3<"$gk_out"
  rm -f "$gk_out"
  cat <&3
  return $gk_rc
}
# gk_kubeadm_lock: one kubeadm of gpuk8s at a time on a host. An interrupted run's kubeadm goes on to the
#   end (gk_to_the_end) after the cluster lock is released; the next run's kubeadm waits for it here.
gk_kubeadm_lock() {
  mkdir -p /var/lib/gpuk8s && exec 8>>/var/lib/gpuk8s/kubeadm.lock || exit 1
  flock -w 900 8 || { echo "another kubeadm started by gpuk8s still runs on this host (900 s)" >&2; exit 75; }
}
