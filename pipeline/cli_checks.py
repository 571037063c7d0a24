"""The command line's own checks and adjustments of what it was given, before a stage runs:
a device this machine has, where a value came from (the option or the params file's key,
for an error naming it), and a ``score`` call's per-seed and replacement lists cut
to the ``--variant`` / ``--suite`` it names."""

from __future__ import annotations

from pathlib import Path


def check_device(device: str) -> None:
    """Refuse a torch device this machine does not have before any store is opened or
    model built (``--device cuda`` on a host without a CUDA driver), naming what torch says,
    and the ``meta`` device, which computes no values."""
    import torch

    try:
        if torch.device(device).type == "meta":  # it allocates, but holds shapes only: every feature would be garbage
            raise RuntimeError("the meta device holds tensors' shapes, not their values")
        torch.empty(0, device=torch.device(device))
    except (RuntimeError, AssertionError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"device {device!r} is not usable here ({reason}); pass --device cpu or set the params file's device") from None


def narrowed(cfg, variants: list[str] | None, suites: list[str] | None):
    """``cfg`` with its per-seed and replacement lists cut down to the ``--variant`` /
    ``--suite`` given on the command line: those lists name the params file's whole set, and
    a narrowed call scores (and refuses) only what it was asked for."""
    from dataclasses import replace

    changes: dict = {}
    seed_variants = list(cfg.seed_variants)
    if variants:
        seed_variants = [v for v in seed_variants if v in cfg.variants]
        if cfg.replacement_variants:
            kept = [v for v in cfg.replacement_variants if v in cfg.variants]
            changes["replacement_variants"] = kept
            if not kept:
                changes["replacements"] = []  # [] would mean every variant
    if suites and cfg.seed_suites:
        kept = [s for s in cfg.seed_suites if s in cfg.suites]
        changes["seed_suites"] = kept
        if not kept:
            seed_variants = []  # [] would mean every suite
    changes["seed_variants"] = seed_variants
    return replace(cfg, **changes)


def origin(params: Path | None, key: str, option: str, given: object) -> str:
    """Where a value an error names came from: ``option`` when given on the command line,
    else ``<params>: key`` (``key`` alone when no params file is read)."""
    if given is not None:
        return option
    return f"{params}: {key}" if params is not None else key
