"""The package list, the one build setting pyproject.toml cannot say: src/'s packages, found, plus speedrun.conf,
which pyproject's package-dir maps to conf/ at the repository root. A find in pyproject scans folders and would miss
it (conf/ is outside src/), and a written-out list would miss the next new package. Everything else is in
pyproject.toml."""

from setuptools import find_namespace_packages, setup

# namespace packages: hydra_plugins has no __init__.py (Hydra scans it for plugins), nor has data/assets
setup(packages=[*find_namespace_packages("src", include=["speedrun*", "hydra_plugins*"]), "speedrun.conf"])
