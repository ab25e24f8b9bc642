"""The ``cliptrack`` command line (``main``): one module per command (``demo``, ``compare``,
``runs``, ``panels``; ``replay`` lives with the pipeline it drives), each imported only when its
command runs.
"""
