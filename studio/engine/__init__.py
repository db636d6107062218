"""The work itself: export, quantization, compilation, runtimes, measurements."""

from studio.engine import onnxlinks as _onnxlinks

_onnxlinks.install()  # the artifact store hard-links external data; onnx must read it
