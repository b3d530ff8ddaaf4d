# A run from a bundle points the host's package sources and containerd's registry mirrors at the serving host;
# when the run ends they are put back as they were (docs/airgap.md). Only the files named here: gpuk8s's own
# source files and hosts.toml, none other. Kept under /var/lib/gpuk8s/bundle-sources (root's alone: a hosts.toml
# may hold a mirror's credentials), each copy with its mode and owner, or an ".absent" mark.
#   in:  each file as it is now kept under before/, unless a copy of it is there already (an earlier run from a
#        bundle that was cut before its end left it: that copy is how the file was); then the copy the last run
#        from a bundle left under served/ put in place, so that this run's playbooks find each file as they would
#        write it and a re-run changes nothing.
#   out: each file as this run leaves it kept under served/, and its copy under before/ put back.
# One at a time on a host (flock: a run that was stopped may still be ending here).
d=/var/lib/gpuk8s/bundle-sources
mkdir -p "$d" && chmod 0700 "$d" || exit 1
exec 9>>"$d/lock" && flock -w 60 9 || { echo "another gpuk8s run holds $d/lock (60 s)" >&2; exit 75; }
# gk_copy FILE DIR: FILE's copy (mode and owner kept) or its ".absent" mark under DIR, whole or not at all
gk_copy() {
  gk_to=$2$1
  mkdir -p "${gk_to%/*}" || return 1
  rm -f "$gk_to" "$gk_to.absent"
  if [ -e "$1" ]; then
    cp -p "$1" "$gk_to.part" && mv -f "$gk_to.part" "$gk_to"
  else
    : > "$gk_to.absent"
  fi
}
# gk_restore FILE DIR: FILE as its copy under DIR has it (removed where it was absent); nothing without a copy
gk_restore() {
  gk_from=$2$1
  if [ -e "$gk_from.absent" ]; then
    rm -f "$1"
  elif [ -e "$gk_from" ]; then
    mkdir -p "${1%/*}" && cp -p "$gk_from" "$1.gpuk8s-part" && mv -f "$1.gpuk8s-part" "$1"
  fi
}
rc=0
{%- if mode == "in" %}
{%- if not serving %}
# a server an earlier run kept here (--keep-serving) ends: this run serves from another host
rm -f /var/lib/gpuk8s/bundle/serving /var/lib/gpuk8s/bundle/serving.log
{%- endif %}
{%- for f in files %}
if [ ! -e "$d/before"{{ f }} ] && [ ! -e "$d/before"{{ f }}.absent ]; then gk_copy {{ f }} "$d/before" || rc=1; fi
gk_restore {{ f }} "$d/served" || rc=1
{%- endfor %}
{%- else %}
# every file a copy under before/ names (this run's and those of an earlier run that was cut before its end)
cd "$d" || exit 1
find before -type f 2>/dev/null | sed -e 's|^before||' -e 's|\.absent$||' | sort -u |
  while IFS= read -r f; do
    case "$f" in /etc/apt/*|/etc/yum.repos.d/*|/etc/containerd/certs.d/*) ;; *) continue ;; esac
    case "$f" in *.part) continue ;; esac
    gk_copy "$f" "$d/served" && gk_restore "$f" "$d/before" || exit 1
  done || rc=1
[ "$rc" = 0 ] && rm -rf "$d/before"
{%- endif %}
exit $rc
