# The bundle on its serving host (/var/lib/gpuk8s/bundle): "unpacked" when it is there whole already, else
# "part N": how many bytes of its copy arrived (a copy that was cut goes on from there). A part longer than the
# bundle is no part of it: removed (gpuk8s's own file, by its name), and the copy starts again.
d=/var/lib/gpuk8s/bundle
s={{ sha256 }}
if [ -s "$d/$s/manifest.json" ]; then echo unpacked; exit 0; fi
n=$(stat -c %s "$d/$s.tar.zst.part" 2>/dev/null || echo 0)
if [ "$n" -gt {{ size }} ]; then rm -f "$d/$s.tar.zst.part"; n=0; fi
printf 'part %s\n' "$n"
