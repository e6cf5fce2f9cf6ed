"""tokdyn version (a module of its own: the store and the fit record it without importing the package)."""

__version__ = "0.1.0"
