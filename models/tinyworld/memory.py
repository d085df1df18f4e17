"""TinyWorld's world memory: what a session has shown, kept in world coordinates and shown again on return.

The camera warp already carries what stays on screen; what leaves it was forgotten, so walking away and
back showed new ground. The memory keeps every shown world pixel in a canvas that wraps
(`models.spec.WorldMemorySpec`, `MEMORY_VIEWS` views on a side), each cell tagged with the ground it holds:

- the session's camera position (state "camera": int64 (x, y, world), the view's top-left corner in world
  pixels and the world's number) advances by each frame's camera move; a cut (a prompt that changed the
  world: the network repainted the whole frame) starts a new world, so earlier ground is no longer recalled;
- before a frame is painted, the cells of its view are read (`recall`): where the warp shows nothing and a
  cell holds this very position of this world, the pixel is known, exactly as it was shown, and the network
  paints only ground never seen (`network.TinyWorldDenoiser.predict`, `recalled`);
- when the frame commits, its view is written into its cells (`remember`), the player marker excepted (an
  overlay, not ground: the cells under it keep what they held).

A tag is ((world mod 127) + 1) * 2**24 + (Y div side mod 4096) * 4096 + (X div side mod 4096): never 0 (an empty
cell), and the same for two positions only if they lie a multiple of 4096 canvases apart on both axes (4.7 M
px: about 16 hours of walking at Shift speed) and in worlds 127 switches apart. Everything is tensor
arithmetic on the device, no host sync.

Memory is a prior, not something the network learned: the network paints new ground; recalling old ground
is this module's exact copy, as the warp is for ground still on screen.
"""

from __future__ import annotations

import torch

from worldcast.models.base import MemoryWrite
from worldcast.models.tinyworld.backbone import to_frame_space

#: Canvas side in views: 18 views of 64 px = 1,152 cells, so a walk that keeps within 8.5 views (544 px) of a
#: place in every direction forgets nothing it showed (the issue asked for at least eight).
MEMORY_VIEWS = 18
#: World numbers cycle through this many before a tag repeats (`tag_codes`).
WORLD_CYCLE = 127
#: Wraps of the canvas per axis a tag tells apart (`tag_codes`).
WRAP_CYCLE = 4096


def memory_side(frame_size: int) -> int:
    """Canvas side, cells, for frames of `frame_size` px."""
    return MEMORY_VIEWS * frame_size


def memory_reach(frame_size: int) -> int:
    """Pixels around a place, in every direction, within which a walk forgets nothing it showed."""
    return (memory_side(frame_size) - frame_size) // 2


def view_cells(camera: torch.Tensor, frame_size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cells of the views at `camera` and their tags.

    Args:
        camera: int64 (B, 3): the view's top-left corner in world pixels (x, y) and the world's number.
        frame_size: S, the view's side.
        side: the canvas side.

    Returns:
        cells int64 (B, S*S), the flat cell (row * side + column) of each view pixel in row-major order, and
        tags int32 (B, S*S), the code of the ground each pixel shows (module doc).
    """
    r = torch.arange(frame_size, device=camera.device)
    xs = camera[:, :1] + r[None]  # (B, S) world column of each view column
    ys = camera[:, 1:2] + r[None]  # (B, S) world row of each view row
    cells = (ys.remainder(side)[:, :, None] * side + xs.remainder(side)[:, None, :]).flatten(1)
    wx = torch.div(xs, side, rounding_mode="floor").remainder(WRAP_CYCLE)
    wy = torch.div(ys, side, rounding_mode="floor").remainder(WRAP_CYCLE)
    world = camera[:, 2:3].remainder(WORLD_CYCLE) + 1  # (B, 1)
    tags = (world[:, :, None] * 2**24 + wy[:, :, None] * WRAP_CYCLE + wx[:, None, :]).flatten(1)
    return cells, tags.to(torch.int32)


def gather(canvas: torch.Tensor, tag: torch.Tensor, slots: torch.Tensor,
           cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the cells hold: values uint8 (B, K, C) and tags int32 (B, K), read in place from the pool's
    canvas (P, side, side, C) and tag (P, side, side) at each row's slot (`slots` int64 (B,))."""
    P, side, _, C = canvas.shape
    return (canvas.view(P, side * side, C)[slots[:, None], cells],
            tag.view(P, side * side)[slots[:, None], cells])


#: What `recall` read of a batch's views, kept for the commit's `remember`: the cells (int64 (B, S*S)), their tags
#: in the chunk's world (int32 (B, S*S)), and what the cells hold now (uint8 (B, S*S, C), int32 (B, S*S)).
ViewCells = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def recall(canvas: torch.Tensor, tag: torch.Tensor, slots: torch.Tensor, camera: torch.Tensor,
           marker: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, ViewCells]:
    """The ground the memory holds for the views at `camera`.

    Args:
        canvas, tag: the pool's memory tensors (`models.base.StateView.memory`).
        slots: int64 (B,) the batch's slots.
        camera: int64 (B, 3) each view's corner and world (`view_cells`), after the frame's move.
        marker: bool (S, S) the player marker (never recalled: the network paints the overlay).

    Returns:
        values float32 (B, 3, S, S) in frame space (0 where not held), exactly the pixels shown there
        before; held float32 (B, 1, S, S), 1 where the memory holds this position of this world; and what
        was read (`ViewCells`), for `remember`.
    """
    S = marker.shape[0]
    cells, tags = view_cells(camera, S, canvas.shape[1])
    vals, have = gather(canvas, tag, slots, cells)
    held = (have == tags) & ~marker.flatten()[None]  # (B, S*S)
    B = camera.shape[0]
    img = to_frame_space(vals.float() / 255.0).view(B, S, S, -1).permute(0, 3, 1, 2)  # (B, 3, S, S)
    heldf = held.view(B, 1, S, S).float()
    return img * heldf, heldf, (cells, tags, vals, have)


def remember(canvas: torch.Tensor, tag: torch.Tensor, slots: torch.Tensor, camera: torch.Tensor,
             frame: torch.Tensor, marker: torch.Tensor, read: ViewCells | None = None) -> MemoryWrite:
    """The memory's update for committed frames: each view pixel into its cell, tagged with its ground.

    Args:
        canvas, tag, slots: as in `recall`.
        camera: int64 (B, 3) each view's corner and world, as the frame committed them.
        frame: uint8 (B, S, S, 3) the frames as shown.
        marker: bool (S, S) the player marker, whose cells keep what they held.
        read: what `recall` read of the same views (the same corners; the world may have changed since), or
            None: read here.

    Returns:
        a `MemoryWrite` of the S*S cells of each view (distinct cells: the canvas is wider than a view).
    """
    B, S = frame.shape[:2]
    if read is None:
        cells, tags = view_cells(camera, S, canvas.shape[1])
        old_vals, old_tags = gather(canvas, tag, slots, cells)
    else:  # the same cells; the tags in this world (a cut changed the world number, not the positions)
        cells, tags, old_vals, old_tags = read
        world = (camera[:, 2:3].remainder(WORLD_CYCLE) + 1).to(torch.int32)
        tags = torch.bitwise_and(tags, 2**24 - 1) + world * 2**24
    m = marker.flatten()[None]  # (1, S*S)
    values = torch.where(m[..., None], old_vals, frame.reshape(B, S * S, -1))
    return MemoryWrite(cells, values, torch.where(m, old_tags, tags))
