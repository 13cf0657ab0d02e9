"""Dispatch by shape bucket: which provider (one of our variants or a torch op) runs a call.

A bucket is the part of a call that decides speed: categorical fields (dtype, head dim, mod or epilogue, weight
layout, ...) and log2 bins of the sizes (M, N, K; Lq, Lk, B*H). The table maps measured buckets to the provider that
was fastest there (bench/suite, recorded per device); it is built by gen (gen/analysis/dispatch_table.py) into the generated
package as dispatch.json. A bucket that was not measured takes the nearest measured bucket with the same categorical
fields (at most MAX_DISTANCE bins away in total), else the table's conservative default (a torch provider).
Lookups are memoized, so a call costs one tuple build and one dict lookup.
"""
from __future__ import annotations

MAX_DISTANCE = 2
MAX_BIN = 40   # log2 of the largest size a free axis (a symbolic dim under torch.compile) is taken to reach


def variant_target(name: str) -> str:
    """The target a variant (provider) name builds for: "sm90_m64" -> "sm90" (a spec's named config of sm90),
    "sm90" -> "sm90"; torch provider names come back unchanged."""
    return name.split("_", 1)[0]


def variant_name(target: str, name: str) -> str:
    """The module and provider name of a spec's named config of `target`: ("sm90", "m64") -> "sm90_m64"."""
    return f"{target}_{name}"


def log2_bin(x: int) -> int:
    """floor(log2(x)) for x >= 1: 1 -> 0, 2-3 -> 1, 4-7 -> 2, ..., 4096-8191 -> 12."""
    return int(x).bit_length() - 1


class BucketTable:
    """buckets: {(categorical tuple, bins tuple): provider}; `pick(categorical, bins)` -> provider."""

    def __init__(self, buckets: dict, default: str, allowed: tuple = ()):
        # a provider this machine cannot run (say sm100 on a Hopper table) is never picked
        self.buckets = {k: v for k, v in buckets.items() if not allowed or v in allowed}
        self.default = default
        self.categoricals = frozenset(cat for cat, _ in self.buckets)   # the categorical fields measured at all
        self._memo: dict = {}

    def pick(self, categorical: tuple, bins: tuple) -> str:
        key = (categorical, bins)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._nearest(categorical, bins)
        return got

    def picks(self, categorical: tuple, bins: tuple) -> frozenset:
        """Every provider `pick` can return when the bins given as None are free (any size): what a trace with
        symbolic sizes may run. Memoized; the free axes are enumerated over 0..MAX_BIN."""
        key = ("picks", categorical, bins)
        got = self._memo.get(key)
        if got is None:
            combos = [()]
            for b in bins:
                combos = [c + (x,) for c in combos for x in (range(MAX_BIN + 1) if b is None else (b,))]
            got = self._memo[key] = frozenset(self.pick(categorical, c) for c in combos)
        return got

    def _nearest(self, categorical: tuple, bins: tuple) -> str:
        exact = self.buckets.get((categorical, bins))
        if exact is not None:
            return exact
        best, best_d = self.default, MAX_DISTANCE + 1
        for (cat, b), provider in sorted(self.buckets.items()):   # sorted: ties resolve the same on every machine
            if cat != categorical or len(b) != len(bins):
                continue
            d = sum(abs(x - y) for x, y in zip(b, bins))
            if d < best_d:
                best, best_d = provider, d
        return best

    @classmethod
    def from_json(cls, data: dict, allowed: tuple = (), field="provider",
                  default_field: str = "default") -> "BucketTable":
        """field: "provider" (eager calls), "traced_provider" (calls traced by torch.compile, where ours is a custom
        op), "varying_provider" (calls whose length varies call to call) or "traced_varying_provider", or a tuple of
        them, the first a bucket has; a bucket without any uses "provider". default_field: the table's provider for
        unmeasured buckets ("default", or "varying_default"); a table without it uses "default"."""
        fields = (field,) if isinstance(field, str) else tuple(field)

        def provider(e: dict) -> str:
            return next((e[f] for f in fields if f in e), e["provider"])

        buckets = {(tuple(e["categorical"]), tuple(e["bins"])): provider(e) for e in data.get("buckets", [])}
        return cls(buckets, data.get(default_field, data["default"]), allowed)
