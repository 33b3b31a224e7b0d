"""Data contracts: a pydantic model for every file oracle-build reads or writes."""
