"""aicluster: many GPU machines behaving as one AI supercomputer."""

__version__ = "0.1.0"
__all__ = ["__version__"]
