#!/usr/bin/env bash
# Builds the wheel and the sdist into dist/ (python -m build, in an isolated build environment
# that fetches setuptools) and lists what they carry. Pass --no-isolation to build with the
# setuptools installed here instead (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import build" 2>/dev/null || "$PY" -m pip install "build>=1"
rm -rf dist/qstudio-*.whl dist/qstudio-*.tar.gz build/lib build/bdist.*
SECONDS=0
"$PY" -m build --outdir dist "$@" .
took=$SECONDS
whl=$(ls dist/qstudio-*.whl)
sdist=$(ls dist/qstudio-*.tar.gz)
"$PY" - "$whl" "$sdist" <<'PY'
import sys, tarfile, zipfile
whl, sdist = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    infos = [i for i in z.infolist() if not i.is_dir()]
    res = [i for i in infos if "/resources/" in i.filename]
    print(f"wheel  {whl}: {sum(1 for _ in infos)} files, "
          f"{sum(i.file_size for i in infos) / 2**20:.1f} MiB unpacked; "
          f"resources {len(res)} files, {sum(i.file_size for i in res) / 2**20:.1f} MiB")
with tarfile.open(sdist) as t:
    members = [m for m in t.getmembers() if m.isfile()]
    print(f"sdist  {sdist}: {len(members)} files, "
          f"{sum(m.size for m in members) / 2**20:.1f} MiB unpacked")
PY
ls -la "$whl" "$sdist"
echo "built in ${took} s"
