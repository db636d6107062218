"""The frozen desktop build's entry script: the same ``studio`` entry point as the wheel.

``qstudio`` with no arguments opens the window, ``qstudio FILE.qstudio`` opens that project,
anything else is the CLI (``qstudio --batch FILE``); ``qstudio --studio-worker`` is a stage
worker, which the app starts as a subprocess of itself.
"""

import sys

from studio.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
