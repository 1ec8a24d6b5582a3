"""Code generation: Triton kernels (triton.py), C++ kernels (cpp.py), the Python wrapper (wrapper.py).

common.py documents the protocol between the scheduler, a kernel backend and the wrapper.
"""
