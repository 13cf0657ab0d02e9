"""gemm: the build of triton 3.8.0 (`python -m gen specs/gemm.yaml` with that release installed): the
variants that passed its gates, with its configs and bundles (kernels/). Cross-compiled and gated, not run on a GPU:
only the package's own build (one folder up) ran on one. The package picks these modules on that release
(gen.runtime.op.OpRuntime.release_build); manifest.json and REPORT.md here say what was built and why."""
SHIPPED = ['sm100', 'sm100_pair', 'sm90', 'sm90_m64', 'sm90_m64n64', 'sm90_n128', 'sm90_splitk', 'sm90_swap16', 'triton', 'triton_splitk']
