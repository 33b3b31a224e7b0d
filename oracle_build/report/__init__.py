"""The reports people and CI read, from the typed reports the services return: one function
from a verdict to its words (``words.py``), used by the terminal's table and diff's account
(``text.py``), JUnit XML and the Markdown step summary (``ci.py``) and the HTML page
(``page.py`` builds its data, ``html.py`` draws it from its template). Every value from a
file, a run or a registry is shown as data (``values.py``; the page's template escapes by
default). Importing this package imports none of its modules."""
