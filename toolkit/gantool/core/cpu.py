"""What the CPU's math libraries are allowed to use here, beyond what the CPU has.

``ONEDNN_MAX_CPU_ISA`` (``DNNL_MAX_CPU_ISA`` before oneDNN 2.x) caps the instruction set of oneDNN,
which runs torch's and OpenVINO's convolutions. Capped below AVX512_CORE_BF16 it has no bf16 kernels
even on a CPU that has them: OpenVINO then cannot compile a bf16 model ("could not create a primitive
descriptor for the deconvolution forward propagation primitive") and torch's bf16 convolutions run
emulated. CI sets it (with ``ATEN_CPU_CAPABILITY=avx2``) to run the kernels an older CPU would, so a
capped process must choose as that CPU would: no bf16.
"""

from __future__ import annotations

import os

ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# oneDNN's ISA names below AVX512_CORE_BF16 (oneDNN's dnnl_cpu_isa_t, x86): no bf16 kernels when capped there.
ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_MIC", "AVX512_MIC_4OPS", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


def onednn_bf16_capped() -> bool:
    """Whether this process caps oneDNN below the ISAs with bf16 kernels (``ONEDNN_MAX_CPU_ISA``)."""
    for name in ONEDNN_ISA_VARIABLES:
        value = os.environ.get(name, "").strip().upper()
        if value:  # oneDNN reads the first one that is set
            return value in ONEDNN_ISAS_WITHOUT_BF16
    return False
