"""speedrun's version, apart from the package's __init__ so that any layer may read it (the self-extracting file
records it) without importing the entry point."""

__version__ = "0.1.0"
