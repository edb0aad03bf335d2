"""The package version, in one place (``fxloom.__version__`` and saved files read it)."""

__version__ = "0.1.0"
