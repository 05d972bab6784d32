"""``fpx.abft``: fault-tolerant GEMMs -- every matmul, linear, convolution (as a GEMM) and
contraction of a program computed with row and column checksums, verified against an adaptive
threshold (V-ABFT, A-ABFT, rigorous, or the user's), located and corrected (docs/abft.md).

Modules: ``gemm`` (the mixed-precision GEMM model and its primitives, which ``fpx.inject``
reaches into), ``thresholds`` (V-ABFT Eq. 23, A-ABFT, the rigorous bound, e_max presets),
``sums`` (the checksums and statistics: fused numba passes, or the NumPy reference),
``check`` (verification, location, correction), ``report`` (the records),
``interpreter`` (the rules), ``transform`` (``abft``, ``abft.calibrate``).

References: Y. Gao, Q. Hua, Z. Chen, "V-ABFT: Variance-Based Adaptive Threshold for
Fault-Tolerant Matrix Multiplication in Mixed-Precision Deep Learning"; C. Braun, S. Halder,
H.-J. Wunderlich, "A-ABFT" (DSN 2014); K.-H. Huang, J. A. Abraham (1984).
"""
from fpx.transforms.abft.gemm import GEMM, STORE, Site
from fpx.transforms.abft.report import GemmRecord, Report
from fpx.transforms.abft.thresholds import AAbft, DEFAULT_EMAX, PRESETS, aabft_sigma
from fpx.transforms.abft.transform import Calibration, abft, calibrate

__all__ = ["abft", "calibrate", "Calibration", "Report", "GemmRecord", "AAbft", "aabft_sigma",
           "PRESETS", "DEFAULT_EMAX", "GEMM", "STORE", "Site"]
