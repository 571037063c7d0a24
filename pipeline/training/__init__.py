"""Training scorers from the feature cache: one loop (:mod:`~pipeline.training.loop`), the
hook a family implements (:mod:`~pipeline.training.trainer`), the pair-suite loader every
family's step gathers from (:mod:`~pipeline.training.pairs`), and two parts shared with the
toy CLIP's trainer: the learning-rate schedule (:mod:`~pipeline.training.schedule`) and the
reading of a resume snapshot (:mod:`~pipeline.training.resume`).

    from pipeline.training.loop import train_variant
"""
