"""Commands that measure and check: the benchmarks (``benchmarks.bench_train``,
``bench_inpaint``, ``bench_serve``, ``bench_ray_inpaint``), the evaluation against classical
inpainting (``evaluate.evaluate``) and the install check (``doctor``).
"""
