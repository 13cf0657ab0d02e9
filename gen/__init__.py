"""gen: YAML kernel specs -> Blackwell (sm100) / Hopper (sm90) Gluon and portable Triton kernels.

Pipeline (one module per stage): spec -> plan -> render -> compile -> mlir -> verify -> bench -> emit.
See README.md and docs/.
"""

__version__ = "0.1.0"
