"""Node tests a provider is known to fail, each with its reason.

Excluded tests still run, as strict expected failures: if one starts passing, the
suite fails until it is removed from this list.
"""

#: CPUExecutionProvider (and every provider set, since all fall back to it)
CPU = {
    "test_bernoulli": "random output: the expected values come from one particular random generator",
    "test_bernoulli_double": "random output: the expected values come from one particular random generator",
    "test_bernoulli_expanded": "random output: the expected values come from one particular random generator",
    "test_bernoulli_double_expanded": "random output: the expected values come from one particular random generator",
    "test_bernoulli_seed": "the expected values were drawn from numpy's global random state when the "
    "test data was generated, not from the node's seed, so no implementation can reproduce them",
    "test_bernoulli_seed_expanded": "the expected values were drawn from numpy's global random state when "
    "the test data was generated, not from the node's seed, so no implementation can reproduce them",
}

#: per provider name: extra exclusions on top of CPU's
BY_PROVIDER: dict[str, dict[str, str]] = {}


def excluded(provider: str) -> dict[str, str]:
    """Every exclusion that applies when ``provider`` runs with the CPU fallback."""
    out = dict(CPU)
    out.update(BY_PROVIDER.get(provider, {}))
    return out
