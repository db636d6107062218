#!/usr/bin/env bash
# Installs the built wheel (dist/qstudio-*.whl, from packaging/build-dist.sh) into a fresh
# virtualenv that sees no other site-packages, then, from a folder outside the checkout:
#   studio --help; studio targets; studio new p.qstudio --sample tiny-coder; studio --batch p.qstudio
# and the shipped example project (examples/tiny-coder, which names sample:tiny-coder) with
# --stages export,quantize. Prints the install time, the venv's size and each command's time.
# CHECK_DIR (default: a new temp folder) holds the venv and the work folder; KEEP=1 keeps it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
whl=$(ls "$repo"/dist/qstudio-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || { echo "no wheel in dist/: run packaging/build-dist.sh first" >&2; exit 2; }
dir=${CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/qstudio-wheel-check.XXXXXX")}
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$dir"' EXIT
venv=$dir/venv
work=$dir/work
mkdir -p "$work"
# nothing from the checkout or another install may leak in
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV

echo "== fresh virtualenv (no system site-packages): $venv"
"$PY" -m venv "$venv"
SECONDS=0
"$venv/bin/python" -m pip install -q "$whl"
install_s=$SECONDS
echo "installed $(basename "$whl") and its dependencies in ${install_s} s; venv $(du -sh "$venv" | cut -f1)"
"$venv/bin/python" -m pip check
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(qstudio|torch|onnxruntime|onnxruntime-qnn|PySide6[-_]Essentials|transformers) '

cd "$work"
# the studio that runs is the installed one, with its resources, not a checkout's
"$venv/bin/python" - "$venv" <<'PY'
import sys
from pathlib import Path

import studio
from studio.core.resources import resources_dir

venv = Path(sys.argv[1]).resolve()
here = Path(studio.__file__).resolve()
assert venv in here.parents, f"studio imported from {here}, not from {venv}"
res = resources_dir()
assert venv in res.resolve().parents and (res / "catalog" / "chips.toml").is_file(), res
print("studio imported from", here.parent)
PY
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
s=$(now); "$venv/bin/studio" --help > /dev/null; echo "studio --help: $(since "$s") s"
"$venv/bin/studio" targets | head -3
s=$(now)
"$venv/bin/studio" new p.qstudio --sample tiny-coder
"$venv/bin/studio" --batch p.qstudio
batch_s=$(since "$s")
ls p.studio/reports/*.html > /dev/null
echo "studio new + --batch (full pipeline on the HTP simulator): ${batch_s} s"
# the shipped example project refers to the sample by name (sample:tiny-coder)
cp "$repo/examples/tiny-coder/tiny-coder.qstudio" .
s=$(now)
"$venv/bin/studio" --batch tiny-coder.qstudio --stages export,quantize --quiet
echo "examples/tiny-coder --batch --stages export,quantize: $(since "$s") s"
echo "OK: install ${install_s} s, venv $(du -sh "$venv" | cut -f1), batch ${batch_s} s"
