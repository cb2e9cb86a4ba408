"""xDSL dialects of rpegc: `rpeg` (cyclic graph, cluster, plan) and `exec` (executable DAG)."""
