"""A machine-readable frame stamp: frame index and last applied action seq, drawn into the pixels.

Off by default and only for measurement: when enabled, the server overwrites the bottom band of
every outgoing picture with this code, so a benchmark client can read it back from the *decoded*
frame after VP8 or H.264 compression and measure true motion-to-photon latency on any transport.

Layout (all sizes in pixels; `c` is the cell side, `STAMP_CELL_PX` by default):

* 64 square cells of c x c, each pure black (0) or pure white (255) in all three channels,
  in `STAMP_ROWS` = 2 rows of `STAMP_CELLS_PER_ROW` = 32 cells, filling x in [0, 32c) and the
  bottom 2c rows of the image. Pixels right of 32c are left alone. Bit i (0 = first) sits in
  row i // 32, column i % 32; white is 1.
* Bits 0-7: sync pattern 10101010. Bits 8-31: frame_index mod 2**24. Bits 32-55:
  (action_seq + 1) mod 2**24, so 0 means "no action applied yet" (action_seq -1).
  Bits 56-63: CRC-8 of the 48 data bits. Every field is big-endian (most significant bit first).
* CRC-8: polynomial 0x07 (x^8 + x^2 + x + 1), init 0x00, not reflected, no final XOR
  (CRC-8/SMBUS, check value 0xF4 over b"123456789"), computed over the 6 data bytes
  (frame_index then action_seq + 1, 3 bytes each, big-endian).

Reading samples the mean of the central half of each cell (cell edges ring after lossy coding),
thresholds it at mid-grey, and rejects the frame if any cell is within `STAMP_MIN_CONTRAST` of
mid-grey, the sync pattern differs or the CRC fails. Sync and CRC are 16 check bits: a random
full-contrast pattern in the band passes them about once in 65,536 tries (measured: 2 in 200,000);
natural content rarely fills all 64 cells at full contrast, so a stamp is only read from frames the
server stamped in practice. Values wrap modulo 2**24 (about 6.5 days of
frames at 30 fps): readers that run longer unwrap against their own counters.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

#: Cell side, pixels. VP8 codes 16x16 macroblocks with 4x4 transforms (H.264 with 4x4/8x8), so an
#: 8 px cell at full contrast spans whole transform blocks and keeps a flat centre through the coarse
#: quantization of the low bitrates aiortc starts at (250-500 kbit/s); 4 px cells start to blur.
STAMP_CELL_PX = 8
STAMP_CELLS_PER_ROW = 32  #: cells per row of the band
STAMP_ROWS = 2  #: rows of cells in the band
STAMP_BITS = STAMP_CELLS_PER_ROW * STAMP_ROWS  #: 8 sync + 24 frame_index + 24 action_seq + 8 CRC
STAMP_SYNC = 0b10101010  #: the first 8 bits
STAMP_VALUE_BITS = 24  #: width of each value field; values are stored modulo 2**24
#: A cell's central mean must differ from mid-grey (127.5) by at least this much, 0..255 levels.
#: Coded cells sit ~110 levels away; noise and flat content rarely pass for all 64 cells.
STAMP_MIN_CONTRAST = 40.0

_MOD = 1 << STAMP_VALUE_BITS


@dataclass(frozen=True)
class Stamp:
    """What a stamp carries."""

    frame_index: int  #: index of the frame, modulo 2**24
    action_seq: int  #: seq of the last applied action, modulo 2**24; -1 when none applied yet


def cell_px_for_width(width: int) -> int:
    """The cell side writers and readers agree on for a picture `width` pixels wide:
    `STAMP_CELL_PX`, or less for pictures narrower than `min_width()` (at least 1).

    Raises:
        ValueError: `width` is under `STAMP_CELLS_PER_ROW` pixels (no code fits).
    """
    if width < STAMP_CELLS_PER_ROW:
        raise ValueError(f"a stamp needs a picture at least {STAMP_CELLS_PER_ROW} px wide, got {width}")
    return min(STAMP_CELL_PX, width // STAMP_CELLS_PER_ROW)


def stamp_height(cell_px: int = STAMP_CELL_PX) -> int:
    """Rows of pixels the stamp occupies at the bottom of the image."""
    return STAMP_ROWS * _check_cell(cell_px)


def min_width(cell_px: int = STAMP_CELL_PX) -> int:
    """The narrowest image, in pixels, the stamp fits in."""
    return STAMP_CELLS_PER_ROW * _check_cell(cell_px)


def write_stamp(image: np.ndarray, frame_index: int, action_seq: int, *, cell_px: int = STAMP_CELL_PX) -> np.ndarray:
    """Return a copy of `image` with the stamp drawn into its bottom band; the input is not changed.

    Args:
        image: (H, W, 3) uint8 RGB, H >= stamp_height(cell_px), W >= min_width(cell_px).
        frame_index: >= 0; stored modulo 2**24.
        action_seq: seq of the last applied action, >= -1 (-1 = none yet); stored as (action_seq + 1) mod 2**24.
        cell_px: cell side, pixels.

    Returns:
        (H, W, 3) uint8, a new array.

    Raises:
        ValueError: image not uint8 (H, W, 3) or too small; frame_index < 0; action_seq < -1; cell_px < 1.
        TypeError: frame_index or action_seq not an integer.
    """
    if not isinstance(image, np.ndarray):
        raise ValueError(f"stamp: image must be a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"stamp: image must be uint8 (H, W, 3) RGB, got {image.dtype} {image.shape}")
    _check_size(image.shape[0], image.shape[1], cell_px)
    frame_index, action_seq = operator.index(frame_index), operator.index(action_seq)  # numpy ints too; no floats
    if frame_index < 0:
        raise ValueError(f"stamp: frame_index must be >= 0, got {frame_index}")
    if action_seq < -1:
        raise ValueError(f"stamp: action_seq must be >= -1 (-1 = no action yet), got {action_seq}")
    data = ((frame_index % _MOD) << STAMP_VALUE_BITS) | ((action_seq + 1) % _MOD)  # 48 bits
    word = (STAMP_SYNC << 56) | (data << 8) | _crc8(data.to_bytes(6, "big"))
    bits = np.array([(word >> (STAMP_BITS - 1 - i)) & 1 for i in range(STAMP_BITS)], dtype=np.uint8)
    cells = bits.reshape(STAMP_ROWS, STAMP_CELLS_PER_ROW) * np.uint8(255)  # (R, C)
    band = np.kron(cells, np.ones((cell_px, cell_px), dtype=np.uint8))  # (R*c, C*c)
    out = image.copy()
    out[-band.shape[0]:, : band.shape[1], :] = band[:, :, None]
    return out


def read_stamp(image: np.ndarray, *, cell_px: int = STAMP_CELL_PX) -> Stamp | None:
    """Read the stamp from a (decoded) frame.

    Args:
        image: (H, W, 3) uint8 RGB, or (H, W) uint8 luma (the Y plane, video or full range).
        cell_px: cell side the stamp was written with, pixels.

    Returns:
        The stamp, or None when no valid code is found (a cell too close to mid-grey,
        wrong sync pattern or CRC mismatch).

    Raises:
        ValueError: image not uint8 (H, W) or (H, W, 3), or smaller than the stamp; cell_px < 1.
    """
    if not isinstance(image, np.ndarray):
        raise ValueError(f"stamp: image must be a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise ValueError(f"stamp: image must be uint8 (H, W) luma or (H, W, 3) RGB, got {image.dtype} {image.shape}")
    _check_size(image.shape[0], image.shape[1], cell_px)
    c, m = cell_px, cell_px // 4  # m: margin skipped on each side of a cell
    band = image[-stamp_height(c):, : min_width(c)].astype(np.float32)
    if band.ndim == 3:
        band = band.mean(axis=2)  # (R*c, C*c) grey
    cells = band.reshape(STAMP_ROWS, c, STAMP_CELLS_PER_ROW, c)[:, m : c - m, :, m : c - m].mean(axis=(1, 3))
    if np.abs(cells - 127.5).min() < STAMP_MIN_CONTRAST:
        return None
    word = int("".join("1" if v > 127.5 else "0" for v in cells.ravel()), 2)
    data = (word >> 8) & ((1 << 48) - 1)
    if word >> 56 != STAMP_SYNC or word & 0xFF != _crc8(data.to_bytes(6, "big")):
        return None
    return Stamp(frame_index=data >> STAMP_VALUE_BITS, action_seq=(data & (_MOD - 1)) - 1)


def _crc8(data: bytes) -> int:
    """CRC-8/SMBUS: polynomial 0x07, init 0, not reflected, no final XOR."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _check_cell(cell_px: int) -> int:
    if isinstance(cell_px, bool) or not isinstance(cell_px, int | np.integer):
        raise ValueError(f"stamp: cell_px must be an integer, got {type(cell_px).__name__}")
    if cell_px < 1:
        raise ValueError(f"stamp: cell_px must be >= 1, got {cell_px}")
    return cell_px


def _check_size(height: int, width: int, cell_px: int) -> None:
    if height < stamp_height(cell_px) or width < min_width(cell_px):
        raise ValueError(f"stamp: image {height}x{width} (HxW) is too small for the stamp at cell_px={cell_px}: "
                         f"needs at least {stamp_height(cell_px)}x{min_width(cell_px)}")
