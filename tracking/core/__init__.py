"""The torch-free vocabulary every layer speaks.

- ``measures``: the one declaration of what a loss measures (every summed count, gauge sum and
  extreme, the derived means, the packed layout and the merge rules);
- ``keys``: every metric key name cliptrack reads or writes, derived from ``measures``;
- ``sums``: a loss's measured sums on the host, added exactly, means formed once from them;
- ``outputs``: the three forms of a ``ForwardBackwardOutput``, read one way;
- ``validation``: steps and metric values checked (tokens are integers, steps int64);
- ``versions``: the one version check of every vendor seam;
- ``text``: text from a run escaped for where it is shown (terminal, markdown, HTML);
- ``secrets``: what a credential looks like, and its redaction;
- ``jsonready``: values made ready for strict JSON (a non-finite number is ``null``);
- ``lazy``: lazy re-exports, so that a package imports a heavy module only when a name from it is used.
"""
