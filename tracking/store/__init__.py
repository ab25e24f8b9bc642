"""The run store on disk: what the logger writes and the comparison and replay read back.

- ``records``: a point (``Point``, ``RawPoint``), a run (``RunInfo`` and its run.json mapping), run
  statuses and run id rules;
- ``journal``: points.jsonl, the journal of a run (``Journal``, ``Position``): its only reader and writer;
- ``spool``: a run's directory (``RunDir``): run.json, the journal, each sink's acknowledgement, locks;
- ``params``: a sink's params and tags, what it has taken (``ParamBook``, params-<sink>.json);
- ``stamps``: wall-time stamps that keep every point a distinct row (``StepClock``, milliseconds);
- ``files``: a store's files opened as regular files only (``open_regular``);
- ``frame``: the runs a backend's reader hands back, in one tidy frame (``RunSet``, ``LoadedRun``,
  ``build_frame``; numpy and pandas, imported by that module only);
- ``aliases``: other trackers' metric names read as ours (the readers rename through it).

Nothing here imports torch or a backend's library.
"""
