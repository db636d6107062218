"""What the third-party libraries the studio loads may do to the machine, set once per process
by every entry point (the command line, the window, the demo, a stage worker) before any of
them is imported.

- Hugging Face: offline. A checkpoint is a folder on this machine; nothing is fetched and no
  telemetry is sent.
- ONNX Runtime (1.2x and later) opens a telemetry store when it is imported:
  ``~/.cache/Microsoft/DeveloperTools/.onnxruntime/onnxruntime.db`` and a device id beside
  it, in the user's home, even from a command that is then refused. It is turned off; the
  studio needs nothing of it.

What the stages' tools write while they run goes under the project: a stage worker's
``TMPDIR`` is a scratch folder in the project's store (``studio.services.workers``), removed
when the job ends. Nothing of these libraries goes to the user's home. A value the user set
in the environment is kept (these are defaults).

Pure: it only sets environment variables; nothing is imported.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: environment variable -> the value the studio runs the libraries with
DEFAULTS: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "ORT_DISABLE_TELEMETRY": "1",
}


def settle(environ: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`DEFAULTS` in ``environ`` (default: this process's) where it has no value of
    its own; call it before the libraries are imported (ONNX Runtime reads its variable when
    it loads). Child processes inherit them."""
    env = os.environ if environ is None else environ
    for key, value in DEFAULTS.items():
        env.setdefault(key, value)
