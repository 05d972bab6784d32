"""Compute kernels (numba, CuPy raw kernels), installed as ``fpx.kernels``."""
