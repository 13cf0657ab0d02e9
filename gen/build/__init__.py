"""Spec to package: load and plan a spec, render, cross-compile, read the IR, gate, emit the package and its
bundles, and the build record."""
