"""BindCLIP (methods.md §1): one balanced token-patch-depth coupling read as energies.

One package holds the family: :mod:`.model` (the scorer and its variants ``bindclip``,
``bindclip-lesion``, ``bindclip-noconsensus``), :mod:`.objectives` (its six losses),
:mod:`.training` (its hook into the one training loop), :mod:`.diagnostics`,
:mod:`.probes` and :mod:`.analysis` (why it scores what it scores), and :mod:`.report`
(its section of ``reports/report.md``).
"""

from pipeline.scorers.bindclip.model import (
    ENERGIES,
    BindClip,
    BindClipConfig,
    BindClipExplanation,
    bindclip,
    parameter_breakdown,
)


def _make_trainer(objective: dict):
    """The training loop's hook: BindCLIP's data, losses and q0 choice."""
    from pipeline.scorers.bindclip.training import BindClipTrainer

    return BindClipTrainer(objective)


bindclip.make_trainer = _make_trainer  # trained once; lesion and noconsensus load its weights

__all__ = ["ENERGIES", "BindClip", "BindClipConfig", "BindClipExplanation", "parameter_breakdown"]
