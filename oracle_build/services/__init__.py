"""The work behind the commands that run or judge goldens, as functions that take resolved
inputs and return typed reports (contracts/reports.py), as pypa/build keeps ``_builder.py``
apart from ``__main__.py``: ``capture``, ``verify``, ``numerics`` (the kernel battery),
``explain``, ``analyze`` (margin, determinism), ``diff`` (two oracles) and ``compare``
(another engine's output, offline). A service logs progress on stderr and prints nothing
on stdout; it never imports a command module, and no decision in it is taken on an error's
or a verdict's text."""
