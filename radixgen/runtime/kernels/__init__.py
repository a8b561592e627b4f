"""Compute kernels: C kernels for CPU (`csrc/`, built by `build`, bound in one ctypes module each)
and Triton kernels for GPUs."""
