"""The tests, by tier; each tier is a package, so that two tiers may hold modules of one name.

A test module imports its tier's conftest and test modules relatively (`from .conftest import
Cluster`); shared helpers (waits.py, each tier's helper modules) by bare name, from the
folders pyproject.toml's pytest `pythonpath` lists.
"""
