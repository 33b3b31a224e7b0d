"""Reading and writing other projects' golden formats."""
