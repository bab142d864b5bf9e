"""What opens and runs a model file. ``providers`` is the one place that opens ONNX Runtime
sessions and picks torch devices, and says what really runs (``open_session``, ``torch_device``);
``backends`` holds the inference backends (ONNX, ``.pt2``, AOTInductor, TorchScript, eager) at each
precision, their registry and ``load_backend``.
"""
