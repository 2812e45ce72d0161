"""The composition root: the command line, ``llmsla demo`` and ``llmsla doctor``.

The one place that may import every component (``tests/test_architecture.py`` enforces it):
components register their subcommands here and never import each other through it.
"""
