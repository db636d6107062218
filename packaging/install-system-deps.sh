#!/usr/bin/env bash
# The few Debian/Ubuntu system libraries that Qt (PySide6-Essentials) loads, even offscreen,
# and the X11 (xcb) ones its window needs on a desktop or under Xvfb.
# Installs only what is missing (needs root or sudo); does nothing on a machine that has them.
set -euo pipefail
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
need=()
for pair in libEGL.so.1:libegl1 libGL.so.1:libgl1 libxkbcommon.so.0:libxkbcommon0 \
            libfontconfig.so.1:libfontconfig1 libdbus-1.so.3:libdbus-1-3 \
            libglib-2.0.so.0:libglib2.0-0 libxcb-cursor.so.0:libxcb-cursor0 \
            libxcb-icccm.so.4:libxcb-icccm4 libxcb-keysyms.so.1:libxcb-keysyms1 \
            libxkbcommon-x11.so.0:libxkbcommon-x11-0; do
  "$ldconfig" -p | grep -q "${pair%%:*}" || need+=("${pair##*:}")
done
fc-list 2>/dev/null | grep -qi dejavu || need+=(fonts-dejavu-core)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "QStudio's window needs these system libraries: ${need[*]}; install them with your package manager" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${need[@]}"
