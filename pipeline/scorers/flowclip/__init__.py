"""Flow-CLIP (methods.md §2): GCC + ICER over a frozen CLIP, trained with HNB (and CIMR).

One package holds the family: :mod:`.model` (the scorer and its variants ``global-m``,
``flowclip``, ``flowclip-cimr``), :mod:`.objectives` (HNB and CIMR), :mod:`.training` (its
hook into the one training loop), and its report section (:mod:`.report`) with what it
renders: :mod:`.analysis` (ladder, corrections, seed spread), :mod:`.goals` and
:mod:`.sensitivity` (the patch-sensitivity pictures). The three variants have different objectives, so
each is trained separately and owns its checkpoint (``<checkpoints>/<variant>/``).
"""

from pipeline.scorers.flowclip.model import (
    FlowClip,
    FlowClipConfig,
    flowclip,
    flowclip_cimr,
    global_m,
    parameter_breakdown,
)


def _trainer_hook(cimr: bool):
    """The training loop's hook of a variant: HNB, plus CIMR when ``cimr``."""

    def make_trainer(objective: dict):
        from pipeline.scorers.flowclip.training import FlowClipTrainer

        return FlowClipTrainer(objective, cimr=cimr)

    return make_trainer


global_m.make_trainer = _trainer_hook(cimr=False)  # GCC, HNB
flowclip.make_trainer = _trainer_hook(cimr=False)  # GCC + ICER, HNB
flowclip_cimr.make_trainer = _trainer_hook(cimr=True)  # GCC + ICER, HNB + CIMR

__all__ = ["FlowClip", "FlowClipConfig", "parameter_breakdown"]
