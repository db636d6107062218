"""A child process's lifetime tied to its parent's: the stage workers (``python -m
studio.worker``) and the compile stage's part processes must not outlive the process that
started them (a ``kill -9`` of a batch run)."""

from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``); exit now
    if it died before the request took effect. Elsewhere: nothing."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
