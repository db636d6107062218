#!/usr/bin/env bash
# Checks the built desktop app (dist/desktop/qstudio/, from build.sh) as a user without Python
# would run it: an empty environment (env -i) whose PATH holds no python, offscreen Qt.
#   (a) qstudio --help                      (start time, twice: cold and warm page cache)
#   (b) qstudio new P --sample tiny-coder; qstudio --batch P   (the full pipeline, whose stage
#       workers are the app itself: qstudio --studio-worker)
#   (c) the window: started offscreen, it reports when it is shown and quits
# Prints the bundle's size and each time. APP=path/to/qstudio overrides the binary.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
app=${APP:-$repo/dist/desktop/qstudio/qstudio}
[ -x "$app" ] || { echo "no app at $app: run packaging/desktop/build.sh first" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qstudio-desktop-check.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
# a PATH with a few basic tools and no python
mkdir -p "$tmp/bin" "$tmp/home" "$tmp/work"
for tool in ls cat uname; do
  p=$(command -v "$tool") && ln -s "$p" "$tmp/bin/$tool"
done
run() {
  env -i PATH="$tmp/bin" HOME="$tmp/home" LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen \
      QSTUDIO_CONFIG_DIR="$tmp/home/config" "$@"
}
if run /bin/sh -c 'command -v python3 || command -v python'; then
  echo "FAIL: python is on the check's PATH" >&2; exit 1
fi
echo "no python on PATH ($tmp/bin): ok"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

echo "bundle: $(du -sh "$(dirname "$app")" | cut -f1) in $(find "$(dirname "$app")" -type f | wc -l) files ($(dirname "$app"))"
s=$(now); run "$app" --help > "$tmp/help.txt"; help1=$(since "$s")
s=$(now); run "$app" --help > /dev/null; help2=$(since "$s")
grep -q -- "--batch" "$tmp/help.txt"
echo "(a) qstudio --help: ${help1} s (first), ${help2} s (second)"

s=$(now)
run "$app" new "$tmp/work/p.qstudio" --sample tiny-coder
# (the batch writes its progress to stderr)
if ! run "$app" --batch "$tmp/work/p.qstudio" > "$tmp/batch.log" 2>&1; then
  tail -40 "$tmp/batch.log" >&2; echo "FAIL: the batch run failed" >&2; exit 1
fi
grep -E "^ +ok |^ +gate |succeeded" "$tmp/batch.log"
batch=$(since "$s")
ls "$tmp"/work/p.studio/reports/*.html > /dev/null
echo "(b) qstudio new + --batch on the sample (full pipeline, HTP simulator): ${batch} s"

s=$(now)
out=$(run QSTUDIO_EXIT_AFTER_SHOW=1 "$app")
win=$(since "$s")
case "$out" in shown*) ;; *) echo "FAIL: the window did not report being shown: $out" >&2; exit 1;; esac
echo "(c) window shown offscreen (${out}); process wall time ${win} s"
echo "OK: bundle $(du -sh "$(dirname "$app")" | cut -f1), --help ${help1}/${help2} s, window ${win} s, batch ${batch} s"
