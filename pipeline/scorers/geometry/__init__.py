"""Geometry-aware retrieval (methods.md §3; seed ``geometry-aware-retrieval.txt``): a global
CLIP shortlist reranked by per-object structure, and query steering.

* :mod:`.objects`: per-object decomposition from the cache (box-mean patch embeddings or
  re-encoded crops, phrase embeddings, relation layouts, structure matrices);
* :mod:`.rerankers`: ``fgw``, ``hungarian``, ``fgw-hungarian``, ``ridge-fgw``;
* :mod:`.ridge`: the closed-form ridge mapper ``pipeline ridge`` fits;
* :mod:`.steering`: ``steer`` and ``steer-multi``.

Inference-time only: nothing here trains a backbone.
"""

from pipeline.scorers.geometry import rerankers, steering  # noqa: F401  (registration)
