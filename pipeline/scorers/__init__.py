"""Scorer registry: one module per method family, variants registered by name.

    from pipeline.scorers import SCORERS, create_scorer
    SCORERS.names()                      # ['bindclip', 'clip', ...]
    scorer = create_scorer("clip", dims=dims, proj=proj)
"""

from pipeline.scorers.base import SCORERS, Scorer, create_scorer, option_scores

__all__ = ["SCORERS", "Scorer", "create_scorer", "option_scores"]
