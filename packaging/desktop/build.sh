#!/usr/bin/env bash
# The QStudio desktop build for Linux x86_64: a PyInstaller one-folder app in
# dist/desktop/qstudio/ (run dist/desktop/qstudio/qstudio). Needs the studio's dependencies
# installed in the Python that runs it (pip install . or -e .) and PyInstaller, which it
# installs when missing. CPU heavy (torch alone is ~10k modules): minutes on a few cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
"$PY" -c "import PyInstaller" 2>/dev/null || "$PY" -m pip install "pyinstaller>=6.11"
# the checkout comes first on the import path, ahead of any other installed copy of studio
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
nice -n "${NICE:-10}" "$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist/desktop --workpath build/desktop packaging/desktop/qstudio.spec
app=dist/desktop/qstudio
cp packaging/desktop/qstudio.desktop packaging/desktop/qstudio.svg resources/icons/qstudio.png \
   packaging/desktop/install-desktop-entry.sh "$app/"
echo "built $app/qstudio in $(( $(date +%s) - start )) s, $(du -sh "$app" | cut -f1)"
