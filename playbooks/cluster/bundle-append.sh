# Append stdin to the bundle's copy, which must be {{ offset }} bytes long now (what bundle-state said). One copy
# or unpack of a bundle at a time on a host (flock): a run that was cut may have left its copy running.
d=/var/lib/gpuk8s/bundle
s={{ sha256 }}
umask 022
mkdir -p "$d" || exit 1
chmod o+x /var/lib/gpuk8s 2>/dev/null  # the server runs as nobody: it may pass through, not list, gpuk8s's own dir
exec 8>>"$d/$s.lock"
flock -n 8 || { echo "another gpuk8s run is copying or unpacking this bundle on this host: re-run when it ended" >&2; exit 75; }
have=$(stat -c %s "$d/$s.tar.zst.part" 2>/dev/null || echo 0)
if [ "$have" != {{ offset }} ]; then
  echo "the partial copy is $have bytes, not {{ offset }}: another run is copying it; re-run when it ended" >&2
  exit 1
fi
cat >> "$d/$s.tar.zst.part"
