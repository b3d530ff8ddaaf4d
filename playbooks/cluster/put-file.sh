# A file of gpuk8s's on a host, 0600, from stdin, written to a temporary file and renamed over the old one.
umask 077
f={{ path }}
mkdir -p "$(dirname "$f")" && cat > "$f.gpuk8s-tmp" && mv -f "$f.gpuk8s-tmp" "$f"
