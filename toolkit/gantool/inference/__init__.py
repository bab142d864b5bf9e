"""``gantool inpaint`` and the Python API: strategies, mask inputs and the ``Inpainter``
(``inpainter``), the file pipeline with reader and writer threads (``pipeline.run_inpaint``) and the
same pipeline on a Ray Data actor pool (``ray.ray_inpaint``).

Opens models only through ``gantool.runtime``.
"""
