"""One model on several engines, and the command line that compares them.

- engines.py: runners for PyTorch, ONNX Runtime, the engine and Eclipse Aidge
  on one input, the ONNX export cache, the thread pinning of timed runs;
- locate.py: the first node where the engine diverges from a reference
  (:func:`aidge_interop.locate`);
- target.py: the MODEL argument of every command (example, ONNX file or
  module:callable);
- cli.py: the ``aidge-interop`` command (compare, locate, show).

Nothing is imported here: each command loads only what it runs.
"""
