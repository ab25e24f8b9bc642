"""The writer's internals, private to ``cliptrack.log``: the training thread only enqueues; these
threads do all the I/O.

- ``writer``: the inbox, backpressure (in seconds), batches written to the journal (``BackgroundWriter``);
- ``pace``: how fast the spool disk takes the writer's batches;
- ``held``: the journal's tail kept in memory while the disk refuses it (``HeldTail``);
- ``lane``: one thread feeding one sink (``SinkLane``);
- ``delivery``: what a lane sends: batches of journal bytes, the keys a sink refuses;
- ``acks``: a lane's acknowledgement, never saved past the journal on disk (``AckBook``).
"""
