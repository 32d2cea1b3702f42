"""CUDA backend: the kernel IR compiled to PTX, checked by ptxas, run through the driver API.

``transform`` (GPU forms of kernels, as kernel IR rewrites); ``nvvm`` (kernel IR -> NVVM IR);
``gemm`` (tiled shared-memory GEMM); ``plan`` (forms and launch shapes per step); ``ptx``
(libdevice link, optimization, PTX, ptxas); ``bundle`` (``--emit-ptx``/``--emit-check``
directories); ``driver`` (cuda-python calls, importable without onnxsat); ``runtime``
(``CudaModel`` behind ``onnxsat.compile(model, target="cuda")``).
"""
