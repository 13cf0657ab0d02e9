"""Reading compiler output and measurements: the dump scanner, IR baselines, the dispatch table built from the
workload suite."""
