"""What opens and runs a model file. ``providers`` is the one place that opens ONNX Runtime
sessions and picks torch devices, and says what really runs (``open_session``, ``torch_device``);
``backends`` is where every inference backend (ONNX, ``.pt2``, AOTInductor, TorchScript, eager) is
imported from, with their registry and ``load_backend`` (the base class is in ``backend``, the
PyTorch ones in ``torch_backends``).
"""
