"""Scripts run by the ORACLE venv's python. Standard library only; they import nothing
from the harness, so the oracle venv holds exactly what its pin says."""
