#!/usr/bin/env bash
# Adds QStudio to the desktop's application menu for this user: a `qstudio` command in
# ~/.local/bin, the .desktop entry and the icon (freedesktop paths under ~/.local/share).
# Run it from the built app folder (dist/desktop/qstudio/, where build.sh copies it) or from
# packaging/desktop/ after a build; `--uninstall` removes what it added.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
app=${QSTUDIO_APP:-}
if [ -z "$app" ]; then
  for d in "$here" "$here/../../dist/desktop/qstudio"; do
    [ -x "$d/qstudio" ] && [ -f "$d/qstudio" ] && { app=$(cd "$d" && pwd); break; }
  done
fi
data=${XDG_DATA_HOME:-$HOME/.local/share}
bin=$HOME/.local/bin
if [ "${1:-}" = "--uninstall" ]; then
  rm -f "$bin/qstudio" "$data/applications/qstudio.desktop" \
        "$data/icons/hicolor/256x256/apps/qstudio.png" "$data/icons/hicolor/scalable/apps/qstudio.svg"
  echo "removed the QStudio menu entry"
  exit 0
fi
[ -n "$app" ] || { echo "no built app found: run packaging/desktop/build.sh first" >&2; exit 2; }
mkdir -p "$bin" "$data/applications" "$data/icons/hicolor/256x256/apps" "$data/icons/hicolor/scalable/apps"
ln -sf "$app/qstudio" "$bin/qstudio"
png=$here/qstudio.png  # beside it in the built app; in the checkout, the resources' icon
[ -f "$png" ] || png=$here/../../resources/icons/qstudio.png
install -m 644 "$png" "$data/icons/hicolor/256x256/apps/qstudio.png"
install -m 644 "$here/qstudio.svg" "$data/icons/hicolor/scalable/apps/qstudio.svg"
# an absolute Exec line, so the entry works when ~/.local/bin is not on the session's PATH
sed -e "s|^Exec=qstudio|Exec=$app/qstudio|" -e "s|^TryExec=qstudio|TryExec=$app/qstudio|" \
    "$here/qstudio.desktop" > "$data/applications/qstudio.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database -q "$data/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q "$data/icons/hicolor" 2>/dev/null || true
echo "installed: $bin/qstudio -> $app/qstudio, $data/applications/qstudio.desktop"
