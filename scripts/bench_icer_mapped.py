"""Bench: ICER's all-pairs matrix with W applied once per caption and per image (``mapped``,
what :meth:`EvidenceRefinement.matrix` does) against W applied to every pair's context.

    .venv/bin/python scripts/bench_icer_mapped.py [--variant flowclip] [--suite shapes-retrieval]

Loads ``--variant``'s trained checkpoint (W ≠ 0) and, from the cache, the suite's gallery
and queries. Times two shapes, best of ``--repeats``:

* scoring: every query against every gallery image, in the scorer's ``pair_chunk`` passes,
  under ``no_grad`` (the score stage's retrieval);
* training: ``--images`` images against ``--captions`` captions, forward and backward
  (HNB's ``score_matrix`` on a batch).

The per-pair path is the same pass loop calling :func:`pipeline.scorers.flowclip.model.icer`
without ``mapped`` on each image's copy of the captions. Prints seconds and the largest
difference between the two paths. Needs the cache that ``dvc repro`` leaves.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_pair_matrix(refine, image, text, pair_chunk: int):
    """[Ni, Nt] ICER with ``W`` applied to each pair's rejected context (no ``mapped``)."""
    import torch

    from pipeline.scorers.flowclip.model import icer

    q, token_mask = refine.queries(text)
    v, patch_mask = refine.keys(image)
    Ni, Nt = len(image), len(text)
    cap_step = max(1, min(Nt, pair_chunk))
    img_step = max(1, pair_chunk // cap_step)
    rows = []
    for i in range(0, Ni, img_step):
        g = min(img_step, Ni - i)
        cols = []
        for j in range(0, Nt, cap_step):
            q_b, m_b = q[j : j + cap_step], token_mask[j : j + cap_step]
            q_g = q_b[None].expand(g, *q_b.shape).contiguous()
            m_g = m_b[None].expand(g, *m_b.shape)
            cols.append(icer(q_g, v[i : i + g], m_g, patch_mask[i : i + g], refine.W, refine.tau))
        rows.append(torch.cat(cols, 1))
    return torch.cat(rows)


def best_of(repeats: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="flowclip")
    ap.add_argument("--suite", default="shapes-retrieval")
    ap.add_argument("--images", type=int, default=32, help="training shape: images (HNB's U)")
    ap.add_argument("--captions", type=int, default=80, help="training shape: captions (HNB's Nt)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, ScoreConfig, load_config
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scoring import retrieval_rows, suite_inputs

    torch.set_num_threads(args.threads)
    score = load_config(ScoreConfig, args.params, "score")
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    manifest, index = suite_inputs(store, args.suite)
    gallery, queries = retrieval_rows(manifest, index)
    scorer = load_scorer(args.variant, store, score.checkpoints, options=score.options.get(args.variant))
    refine, chunk = scorer.icer, scorer.config.pair_chunk
    if refine is None or not bool(refine.W.any()):
        raise SystemExit(f"{args.variant} has no ICER branch with W != 0; pass a trained flowclip or flowclip-cimr")
    image, text = store.images(gallery), store.texts(queries)
    print(f"{args.variant}: W != 0, pair_chunk {chunk}, {args.threads} threads")

    with torch.no_grad():
        t_map, s_map = best_of(args.repeats, lambda: refine.matrix(image, text, chunk))
        t_pair, s_pair = best_of(args.repeats, lambda: per_pair_matrix(refine, image, text, chunk))
    diff = float((s_map - s_pair).abs().max())
    print(f"scoring {len(queries)} queries x {len(gallery)} images: mapped {t_map:.3f} s, per pair {t_pair:.3f} s "
          f"({t_pair / t_map:.2f}x); max |diff| {diff:.1e}")

    img_b, txt_b = image.index(torch.arange(args.images)), text.index(torch.arange(args.captions))

    def step(fn):
        def run():
            refine.zero_grad(set_to_none=True)
            out = fn(refine, img_b, txt_b, chunk)
            out.sum().backward()
            return out.detach(), refine.W.grad.clone()
        return run

    t_map, (s_map, g_map) = best_of(args.repeats, step(lambda r, i, t, c: r.matrix(i, t, c)))
    t_pair, (s_pair, g_pair) = best_of(args.repeats, step(per_pair_matrix))
    print(f"training {args.images} images x {args.captions} captions, forward + backward: mapped {t_map * 1e3:.1f} ms, "
          f"per pair {t_pair * 1e3:.1f} ms ({t_pair / t_map:.2f}x); max |diff| {float((s_map - s_pair).abs().max()):.1e}, "
          f"W's gradient max |diff| {float((g_map - g_pair).abs().max()):.1e}")


if __name__ == "__main__":
    main()
