# Serve the unpacked bundle on {{ address }}:{{ port }}: for as long as gpuk8s holds this command (its stdin), or
# with keep (--keep-serving) in the background until the file /var/lib/gpuk8s/bundle/serving is gone. The server
# (gpuk8s/data/bundle_serve.py, given here whole) reads files only, as the unprivileged user nobody where runuser
# can switch to it. A server an earlier run kept is ended first (its file removed: it looks every second).
d=/var/lib/gpuk8s/bundle/{{ sha256 }}
keep=/var/lib/gpuk8s/bundle/serving
command -v python3 >/dev/null || { echo "python3 not found on this host: the bundle server needs it" >&2; exit 127; }
log=/var/lib/gpuk8s/bundle/serving.log
if [ -e "$keep" ]; then rm -f "$keep" "$log"; sleep 2; fi
as=
if command -v runuser >/dev/null && id nobody >/dev/null 2>&1; then as="runuser -u nobody --"; fi
{%- if keep %}
: > "$keep" && chmod 0644 "$keep" || exit 1
setsid nohup $as python3 -c {{ server }} "$d" {{ address }} {{ port }} --while "$keep" > "$log" 2>&1 < /dev/null &
i=0
while [ "$i" -lt 100 ]; do
  if grep -qx 'gpuk8s-bundle-serving' "$log" 2>/dev/null; then echo gpuk8s-bundle-serving; exit 0; fi
  kill -0 $! 2>/dev/null || break
  sleep 0.1; i=$((i + 1))
done
rm -f "$keep"
head -c 2000 "$log" >&2
rm -f "$log"
exit 1
{%- else %}
exec $as python3 -c {{ server }} "$d" {{ address }} {{ port }}
{%- endif %}
