"""Training of the shipped sample models (``python -m studio.samples.train``).

The registry of samples and data files is :mod:`studio.core.samples`.
"""
