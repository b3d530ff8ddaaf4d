# Serve the unpacked bundle on {{ address }}:{{ port }} for as long as gpuk8s holds this command (its stdin): the
# server (gpuk8s/data/bundle_serve.py, given here whole) reads files only, as the unprivileged user nobody where
# runuser can switch to it.
d=/var/lib/gpuk8s/bundle/{{ sha256 }}
command -v python3 >/dev/null || { echo "python3 not found on this host: the bundle server needs it" >&2; exit 127; }
if command -v runuser >/dev/null && id nobody >/dev/null 2>&1; then
  exec runuser -u nobody -- python3 -c {{ server }} "$d" {{ address }} {{ port }}
fi
exec python3 -c {{ server }} "$d" {{ address }} {{ port }}
