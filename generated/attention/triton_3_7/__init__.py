"""attention: the build of triton 3.7.1 (`python -m gen specs/attention.yaml` with that release installed): the
variants that passed its gates, with its configs and bundles (kernels/). Cross-compiled and gated, not run on a GPU:
only the package's own build (one folder up) ran on one. The package picks these modules on that release
(gen.runtime.op.OpRuntime.release_build); manifest.json and REPORT.md here say what was built and why."""
SHIPPED = ['sm100', 'sm90', 'sm90_n64', 'triton', 'triton_splitkv', 'triton_splitkvns4']
