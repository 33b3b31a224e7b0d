"""oracle-build: the pinned vLLM oracle as a recipe."""

__version__ = "0.1.0"
