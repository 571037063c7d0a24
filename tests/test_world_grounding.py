"""Words to tokens and boxes to patches (pipeline.world.grounding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.world.grounding import (
    box_cells,
    box_cover,
    box_weights,
    visible_cover,
    word_token_positions,
)


def test_box_cells_and_word_positions():
    cells = box_cells(torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.6, 0.6, 0.65, 0.65]]), (2, 2))
    assert cells.tolist() == [[True, False, False, False], [False, False, False, True]]
    # a box covering a quarter of a 4x4 grid's patch (1,1) and most of (1,2)
    c = box_cells(torch.tensor([[0.3, 0.3, 0.7, 0.45]]), (4, 4)).reshape(4, 4)
    assert c[1, 1] and c[1, 2] and c.sum() == 2

    def encode(w: str) -> list[int]:  # a fake BPE: "hexagon" is two pieces
        return [1, 2] if w == "hexagon" else [3]

    pos = word_token_positions("a red hexagon left of a star", [1, 2, 6], encode)
    assert pos == [[2], [3, 4], [8]]
    assert word_token_positions("a red hexagon", [2], encode, max_tokens=3) == [[3]]
    with pytest.raises(ValueError, match="out of range"):
        word_token_positions("a red", [5], encode)


def test_box_cover_and_area_weights_by_hand():
    # 4x4 grid, patches 0.25 wide: x over [0.3, 0.7] covers 0.8 of column 1 and 0.8 of column 2;
    # y over [0.3, 0.45] covers 0.6 of row 1
    box = torch.tensor([[0.3, 0.3, 0.7, 0.45]])
    cover = box_cover(box, (4, 4)).reshape(4, 4)
    want = torch.zeros(4, 4)
    want[1, 1] = want[1, 2] = 0.8 * 0.6
    torch.testing.assert_close(cover, want)
    torch.testing.assert_close(box_weights(box, (4, 4)), cover.reshape(1, 16))
    # the covered fractions sum to the box's area in patches (0.4 x 0.15 of a 4x4 grid)
    torch.testing.assert_close(cover.sum(), torch.tensor(0.4 * 0.15 * 16))
    # a whole-image box weighs every patch fully; a box of zero area weighs its centre's patch
    torch.testing.assert_close(box_weights(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), (2, 3)), torch.ones(1, 6))
    point = box_weights(torch.tensor([[0.6, 0.1, 0.6, 0.1]]), (2, 2))
    assert point.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    # box_cells thresholds the same cover (a quarter) and adds the centre's patch
    assert box_cells(box, (4, 4)).tolist() == (box_cover(box, (4, 4)) >= 0.25).tolist()


def _square(x: float, y: float, z: int, half: float = 0.25) -> dict:
    r = half / 0.78  # unit_vertices("square") has half-side 0.78 of the circumradius
    return {"shape": "square", "x": x, "y": y, "r": r, "z": z, "box": [x - half, y - half, x + half, y + half]}


def test_visible_cover_subtracts_the_objects_drawn_over_it():
    back, front = _square(0.25, 0.25, z=0), _square(0.5, 0.25, z=1)  # front hides back's right half
    cover = visible_cover([back, front], (2, 2), supersample=16)  # patches (0,0) (0,1) (1,0) (1,1)
    np.testing.assert_allclose(cover[0], [0.5, 0, 0, 0], atol=0.07)
    np.testing.assert_allclose(cover[1], [0.5, 0.5, 0, 0], atol=0.07)
    alone = visible_cover([back], (2, 2), supersample=16)  # nothing over it: the whole square
    np.testing.assert_allclose(alone[0], [1, 0, 0, 0], atol=0.07)


def test_word_positions_match_open_clip_tokenizer():
    import open_clip

    cap = "a small purple hexagon partly covering a yellow pentagon"
    ids = open_clip.tokenize([cap])[0]
    for word_idx, positions in zip([2, 3, 8], word_token_positions(cap, [2, 3, 8]), strict=True):
        from open_clip.tokenizer import _tokenizer

        assert [int(ids[p]) for p in positions] == _tokenizer.encode(cap.split()[word_idx])




def test_view_boxes_follow_open_clips_square_views():
    from pipeline.world.grounding import view_boxes

    boxes = np.array([[0.0, 0.3, 0.12, 0.7], [0.75, 0.1, 0.85, 0.2], [0.0, 0.0, 1.0, 1.0]])
    # 640 x 480, shortest side resized, centre square cropped: x in [1/8, 7/8] of the image survives
    view, seen = view_boxes(boxes, (640, 480), "shortest")
    np.testing.assert_allclose(view[1], [(0.75 * 640 - 80) / 480, 0.1, (0.85 * 640 - 80) / 480, 0.2])
    np.testing.assert_allclose(view[2], [0.0, 0.0, 1.0, 1.0])
    assert seen.tolist() == [False, True, True]  # the first box lies in the cropped-away strip
    # a portrait image crops y instead
    view, _ = view_boxes(np.array([[0.2, 0.5, 0.4, 0.75]]), (480, 640), "shortest")
    np.testing.assert_allclose(view[0], [0.2, (0.5 * 640 - 80) / 480, 0.4, (0.75 * 640 - 80) / 480])
    # longest side resized, the short side padded equally: y shrinks into [1/8, 7/8]
    view, seen = view_boxes(boxes[2:], (640, 480), "longest")
    np.testing.assert_allclose(view[0], [0.0, 0.125, 1.0, 0.875])
    # squash, a square image and an unknown size leave the boxes alone
    for size, mode in (((640, 480), "squash"), ((300, 300), "shortest"), (None, "shortest")):
        view, seen = view_boxes(boxes, size, mode)
        np.testing.assert_array_equal(view, boxes)
        assert seen.all()
    with pytest.raises(ValueError, match="resize_mode"):
        view_boxes(boxes, (640, 480), "crop")
