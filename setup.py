"""The package list, which pyproject.toml cannot give: setuptools finds packages only where
their folders are, and the shipped resources live at the top level, beside studio/ (the
layout of ARCHITECTURE.md), yet must be installed inside the package. So resources/ becomes
the package ``studio.resources`` (its data files: ``[tool.setuptools.package-data]``), and
``studio.core.resources.resources_dir`` finds either place. Everything else is in
pyproject.toml."""

from setuptools import find_namespace_packages, setup

CODE = find_namespace_packages(include=["studio", "studio.*"], exclude=["studio.resources*"])
# the resources' subfolders too, so that setuptools sees each as part of the package
RESOURCES = ["studio.resources", *(f"studio.resources.{p}" for p in
                                    find_namespace_packages(where="resources"))]

setup(packages=[*CODE, *RESOURCES], package_dir={"studio.resources": "resources"})
