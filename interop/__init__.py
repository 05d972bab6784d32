"""Adapters for torch modules and Triton kernels, installed as ``fpx.interop``."""
