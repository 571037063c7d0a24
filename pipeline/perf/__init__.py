"""Speed and memory measurements behind the README's and the report's figures.

``pipeline bench <name>`` runs one and writes ``reports/bench/<name>.json``, which the report
renders. Timings are measurements on whatever machine runs them (the JSON records threads
and sizes), never asserted by tests; what tests assert is that the compared paths agree.

* :mod:`~pipeline.perf.cli`: the ``pipeline bench`` commands (the CLI: each runs one
  measurement below and writes its JSON).
* :mod:`~pipeline.perf.overhead`: one ``pipeline score`` call against its scoring time.
* :mod:`~pipeline.perf.extract`: extract against a bare forward pass; peak memory.
* :mod:`~pipeline.perf.scoring`: each scorer from the cache against re-encoding its items,
  batched as CLIP_benchmark does.
* :mod:`~pipeline.perf.sinkhorn`: the batched Sinkhorn against POT's per-problem loop.
* :mod:`~pipeline.perf.fgw`: the batched exact FGW against POT's per-problem loop (and its
  entropic batch solver), values and time per problem.
* :mod:`~pipeline.perf.rerank`: the geometry-aware rerankers' cost per query, its growth
  with K and the number of objects, and the FGW comparison at the toy's sizes.
"""
