# The bundle on its serving host (/var/lib/gpuk8s/bundle): "unpacked" when it is there whole already, else
# "part N": how many bytes of its copy arrived (a copy that was cut goes on from there).
d=/var/lib/gpuk8s/bundle
s={{ sha256 }}
if [ -s "$d/$s/manifest.json" ]; then echo unpacked; exit 0; fi
printf 'part %s\n' "$(stat -c %s "$d/$s.tar.zst.part" 2>/dev/null || echo 0)"
