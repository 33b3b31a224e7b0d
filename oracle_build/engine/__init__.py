"""The engine: the process that hosts it (``host.py``: the driver started with ``--serve``,
identity facts first, then one engine run), one engine start per configuration
(``session.py``: memory preflight, the one-engine lock, the driver's answer) and the runs a
command asks for (``runs.py``: requests, engine arguments, grouping by engine start).

Nothing here is imported by this ``__init__``: ``oracle/opening.py`` uses the engine host
(an oracle opened for an engine command is probed inside the process that will run the
engine), and ``session.py`` uses an opened oracle."""
