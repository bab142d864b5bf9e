"""``gantool export`` and ``gantool info``: the exporter to every format in the artifacts table
(``exporter.export_generator``, ``exporter.describe_file``), int8 quantization with its quality gate
(``quantize``), the parity sweep that proves each file against eager PyTorch (``parity.parity_sweep``)
and the build-machine trace scanner and scrubbers (``provenance``). Verifies with ``gantool.runtime``.
"""
