"""Training scorers from the feature cache: one loop (:mod:`~pipeline.training.loop`), the
hook a family implements (:mod:`~pipeline.training.trainer`), the pair-suite loader every
family's step gathers from (:mod:`~pipeline.training.pairs`) and the learning-rate schedule
(:mod:`~pipeline.training.schedule`, shared with the toy CLIP's trainer).

    from pipeline.training.loop import train_variant
"""
