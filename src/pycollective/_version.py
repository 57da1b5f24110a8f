"""The package version, in a leaf module so that layers below the package root (the cost
cache keys its files by it) can read it without importing the package."""

__version__ = "0.1.0"
