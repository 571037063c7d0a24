"""Does a Flow-CLIP variant fit its own training pairs? Per-family training-pair accuracy over training.

    .venv/bin/python scripts/flowclip_fit.py [--variant flowclip] [--objective hnb|margin]
        [--lr 1e-3] [--steps 400] [--evals 0 100 200 400] [--out FILE.json]

Trains seed ``--seed`` of ``--variant`` from ``params.yaml``'s ``train.<variant>`` section
(``--lr`` and ``--steps`` override it; the schedule, batch size and batch order are the
training loop's) and, at each step of ``--evals``, scores both captions of every training
item and every dev item per caption. It prints, and with ``--out`` writes as JSON, the
share of training items whose true caption scores above its hard negative, overall and per
family, and the dev suite's mean. No dev selection: the model at each step is the one
measured, so the figures say whether the scorer can fit the pairs it is trained on, not
whether it generalises.

``--objective hnb`` is the variant's own objective (HNB, plus CIMR for ``flowclip-cimr``);
``--objective margin`` replaces it by the pair margin alone, ``mean softplus(-t · (s(I, ✓) -
s(I, ✗)))``: the loss that asks for exactly what the accuracy counts, a ceiling on what the
scorer can represent in these steps. ``--keys early`` is a diagnostic outside the spec: ICER's
patch keys from the cached layer-5 grid (through the same visual projection) instead of the
final grid, to tell the toy's final patches from the ICER mechanism. Needs the cache that ``dvc repro`` leaves; writes
nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="flowclip", choices=["global-m", "flowclip", "flowclip-cimr"])
    ap.add_argument("--objective", default="hnb", choices=["hnb", "margin"])
    ap.add_argument("--lr", type=float, help="peak learning rate (default: the params section's)")
    ap.add_argument("--steps", type=int, help="optimiser steps (default: the params section's)")
    ap.add_argument("--evals", type=int, nargs="+", default=[0, 100, 200, 400])
    ap.add_argument("--keys", default="final", choices=["final", "early"], help="ICER's patch keys (early: diagnostic)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F

    from pipeline.benchmarks.base import SuiteSelection
    from pipeline.benchmarks.coco_families import FAMILIES
    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, load_config, load_train_config
    from pipeline.scorers import create_scorer
    from pipeline.scorers.flowclip.model import EvidenceRefinement, patch_keys
    from pipeline.scorers.flowclip.training import caption_scores, hnb_batch
    from pipeline.training.loop import learning_rate, make_trainer

    if args.keys == "early":
        EvidenceRefinement.keys = lambda self, image: patch_keys(image.early.float(), self.visual_proj)
    overrides = {"lr": args.lr, "steps": args.steps}
    cfg = load_train_config(args.params, args.variant, overrides)
    torch.set_num_threads(cfg.threads)
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    trainer = make_trainer(cfg)
    train_sel = SuiteSelection.parse(cfg.train_suite).sampled(cfg.train_items, cfg.sample_seed)
    dev_sel = SuiteSelection.parse(cfg.dev_suite).sampled(cfg.dev_items, cfg.sample_seed)
    train = trainer.load(store, train_sel, train=True)
    dev = trainer.load(store, dev_sel, train=False)
    dev_suite = dev_sel.suite
    family = train.family.numpy()

    def margin_loss(model, data, batch):
        hb = hnb_batch(data, batch, paraphrases=False)
        S = model.score_matrix(data.images.index(hb.images), data.texts.index(hb.texts))  # [U, 2B]
        B = hb.n_items
        m = model.logit_scale * (S[hb.item_image, torch.arange(B)] - S[hb.item_image, B + torch.arange(B)])  # [B]
        return F.softplus(-m).mean(), {"acc": float((m.detach() > 0).float().mean())}

    loss_fn = trainer.loss if args.objective == "hnb" else margin_loss

    def measure(model, step: int) -> dict:
        model.eval()
        with torch.no_grad():
            s = caption_scores(model, train)  # [n, 2] (true, negative)
            right = s[:, 0] > s[:, 1]
            dev_mean = trainer.dev_metrics(model, dev, dev_suite)["mean"]
        model.train()
        per_family = {FAMILIES[k]: round(float(right[family == k].mean()), 4) for k in np.unique(family)}
        return {"step": step, "train_acc": round(float(right.mean()), 4), "dev_mean": round(float(dev_mean), 4), "train_acc_by_family": per_family}

    torch.manual_seed(args.seed)
    model = create_scorer(cfg.variant, dims=store.dims, proj=store.projections(), **cfg.scorer)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    rows, t0 = [], time.time()
    for step in range(cfg.steps + 1):
        if step in args.evals:
            rows.append(measure(model, step))
            print(json.dumps(rows[-1]), flush=True)
        if step == cfg.steps:
            break
        batch = torch.randperm(len(train), generator=gen)[: cfg.batch_size]
        loss, _ = loss_fn(model, train, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, cfg)
        opt.step()
    result = {
        "variant": cfg.variant,
        "objective": args.objective,
        "keys": args.keys,
        "lr": cfg.lr,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "seed": args.seed,
        "train_items": len(train),
        "dev_suite": cfg.dev_suite,
        "seconds": round(time.time() - t0, 1),
        "evals": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
