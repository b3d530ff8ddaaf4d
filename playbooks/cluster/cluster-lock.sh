# The cluster lock: flock on /var/lib/gpuk8s/cluster.lock, held while this command waits on its stdin (until
# gpuk8s finishes, dies or loses the connection); who holds it, and since when, is written beside it.
d=/var/lib/gpuk8s
command -v flock >/dev/null || { echo "flock not found (util-linux)" >&2; exit 127; }
mkdir -p "$d" && exec 9>>"$d/cluster.lock" || exit 1
if ! flock -n 9; then
  printf '@@gpuk8s-cluster-lock busy %s\n' "$(head -c 300 "$d/cluster.lock.owner" 2>/dev/null)"
  exit 75
fi
printf '%s, since %s\n' {{ owner }} "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$d/cluster.lock.owner"
echo '@@gpuk8s-cluster-lock held'
cat >/dev/null
rm -f "$d/cluster.lock.owner"
