"""Lowering G° to the executable graph, one module per pass (file name = pass name): unroll, split-quantiles,
insert-comm, insert-reshard, share-actor-critic; the decisions they share (rules.py) and the graph edits
(edit.py)."""
