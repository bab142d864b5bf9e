"""Commands that measure and check: the benchmarks, one module per subject
(``bench_train.bench_train``, ``bench_inpaint.bench_inpaint``, ``bench_serve.bench_serve``,
``bench_ray.bench_ray_inpaint``, with ``timing.timed`` shared), the evaluation against classical
inpainting (``evaluate.evaluate``) and the install check (``doctor``).
"""
