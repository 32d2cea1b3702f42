"""Compile and run kernel programs on the CPU.

``codegen`` (kernel IR -> LLVM IR with IRBuilder) and ``mathlib`` (vectorizable exp/erf/tanh);
``gemm`` (packed GEMM micro-kernel); ``jit`` (MCJIT + on-disk cache); ``compile_options``
(``CompileOptions``); ``build`` (a program's kernels to loaded code: object cache, parallel
compile in ``compile_pool``'s helper processes, the ``artefact_cache``); ``blas`` (OpenBLAS via
ctypes); ``arena`` (liveness memory plan); ``executable`` (one compiled program and its step
runners); ``compiled`` (``CompiledModel``); ``llvm_loops`` (the counted and spin loops every
hand-built function uses). Compiling with optimization first is ``onnxsat.compiler``.
"""
