"""The run store: one self-describing directory per experiment (manifest, checkpoints, loss tables),
the loss-table interchange format, RUNNING markers and the shard split.
"""
