"""A built oracle: its venv as one object (``venv.py``: its python, running the inside
scripts), every file of it with its sha256 and the anchor outside it (``inventory.py``), its
identity (``identity.py``: the probe's facts against the pin; ORACLE_IDENTITY_OK), and
opening one for a command (``opening.py``: identity first, every file hashed)."""
