"""The build settings pyproject.toml cannot say: the package list (src/'s packages, found) and, for a wheel, conf/ at
the repository root shipped as the package speedrun.conf. Everything else is in pyproject.toml.

An editable install leaves conf/ where it is (speedrun.paths reads it from the checkout): mapping a folder outside
src/ would make setuptools import the checkout through a finder placed after Python's own, and then a folder named
run/ in the working directory (a run dir) would shadow `python -m run`."""

import sys

from setuptools import find_namespace_packages, setup

# namespace packages: hydra_plugins has no __init__.py (Hydra scans it for plugins), nor has data/assets
packages = find_namespace_packages("src", include=["speedrun*", "hydra_plugins*"])
package_dir = {"": "src"}
if "editable_wheel" not in sys.argv:
    # conf/'s group folders are listed too, as speedrun.conf.<group>: setuptools warns about every folder it would
    # ship as data of a package it was not told of
    packages += ["speedrun.conf", *(f"speedrun.conf.{group}" for group in find_namespace_packages("conf"))]
    package_dir["speedrun.conf"] = "conf"
setup(packages=packages, package_dir=package_dir)
