# The copy checked against the bundle's sha256 (the file gpuk8s verified on this machine, byte for byte), then
# unpacked into a directory of its own, whole or not at all, and the copy removed. Every member is a plain file
# or directory with a plain relative name (gpuk8s/bundle/archive.py checked each before the copy). Other bundles
# unpacked or copied here before (gpuk8s's own, by their names: 64 hex digits) are removed: one bundle's disk.
d=/var/lib/gpuk8s/bundle
s={{ sha256 }}
cd "$d" || exit 1
exec 8>>"$d/$s.lock"
flock -n 8 || { echo "another gpuk8s run is copying or unpacking this bundle on this host: re-run when it ended" >&2; exit 75; }
if [ ! -s "$s/manifest.json" ]; then
  got=$(sha256sum "$s.tar.zst.part" | cut -d' ' -f1)
  if [ "$got" != "$s" ]; then
    rm -f "$s.tar.zst.part"
    echo "the copy on this host has sha256 $got, not $s: it was removed, the next run copies it again" >&2
    exit 1
  fi
  command -v zstd >/dev/null || { echo "zstd not found on this host (apt-get install zstd, dnf install zstd)" >&2; exit 127; }
  umask 022
  chmod o+x /var/lib/gpuk8s 2>/dev/null  # the server runs as nobody: it may pass through, not list, gpuk8s's own dir
  rm -rf "$s.tmp" && mkdir "$s.tmp" || exit 1
  if ! zstd -dcq "$s.tar.zst.part" | tar -x --no-same-owner --no-same-permissions -C "$s.tmp"; then
    rm -rf "$s.tmp"
    echo "the bundle could not be unpacked (is the disk full?)" >&2
    exit 1
  fi
  mv "$s.tmp" "$s" && rm -f "$s.tar.zst.part" || exit 1
fi
for o in *; do
  case "$o" in
    "$s"|"$s.lock") ;;
    [0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]*)
      n=${o%%.*}
      [ "$(printf %s "$n" | wc -c)" -eq 64 ] && [ -z "$(printf %s "$n" | tr -d 0-9a-f)" ] && rm -rf -- "$o" ;;
  esac
done
exit 0
