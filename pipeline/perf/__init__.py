"""Speed and memory measurements behind the README's and the report's figures.

``pipeline bench <name>`` runs one and writes ``reports/bench/<name>.json``, which the report
renders. Nothing here is asserted by tests: these are measurements, on whatever machine runs
them (the JSON records threads and sizes).

* :mod:`~pipeline.perf.extract`: extract against a bare forward pass; peak memory.
* :mod:`~pipeline.perf.score`: scoring from the cache against re-encoding every item.
* :mod:`~pipeline.perf.sinkhorn`: the batched Sinkhorn against POT's per-problem loop.
* :mod:`~pipeline.perf.bindclip`: BindCLIP pairs per second against backbone images per second.
"""
