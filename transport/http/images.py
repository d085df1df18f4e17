"""Starting images of image-conditioned sessions: base64 or multipart bytes -> a checked RGB array.

`POST /v1/sessions` takes an image as base64 in the JSON body (`"image"`, a
bare base64 string or a `data:image/png;base64,...` URL, RFC 2397) or as a
file part of a multipart body. Every limit is checked before the work it
guards: the encoded size before base64 decoding, the declared width and
height (read from the file header) before any pixel is decoded, so an image
that would decompress to gigabytes is refused from its first bytes. Decoding
(Pillow) runs on a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import math
import warnings

import numpy as np

from worldcast.models.spec import ImageConditioning
from worldcast.transport.errors import InvalidImage

#: Pillow's format names -> the names `ImageConditioning.formats` uses.
_FORMATS = {"PNG": "png", "JPEG": "jpeg", "MPO": "jpeg"}  # MPO: multi-picture JPEG (phone cameras)


def max_base64_chars(max_bytes: int) -> int:
    """Longest base64 text of a `max_bytes` file (RFC 4648 section 4: 4 characters per 3 bytes) plus a data-URL
    prefix."""
    return 4 * math.ceil(max_bytes / 3) + 64


def from_base64(text: str, *, max_bytes: int) -> bytes:
    """A base64 image (bare, or a `data:image/...;base64,` URL) -> its bytes.

    Line breaks and spaces inside the text are ignored (base64 wrapped at 76 columns, RFC 2045
    section 6.8); the data URL's scheme and media type are case-insensitive (RFC 2397).

    Raises:
        InvalidImage: too long, not base64, or a data URL that is not base64 image data.
    """
    if len(text) > max_base64_chars(max_bytes) + len(text) // 76 * 2:  # room for CRLF line breaks
        raise InvalidImage(f"over {max_bytes} bytes once decoded (send a smaller image)")
    if text[:5].lower() == "data:":
        head, sep, text = text.partition(",")
        head = head.lower()
        if not sep or not head.endswith(";base64") or not head[5:].startswith("image/"):
            raise InvalidImage("a data URL must be data:image/<type>;base64,<data>")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("not valid base64 (RFC 4648, standard alphabet, padded)") from None
    if len(data) > max_bytes:
        raise InvalidImage(f"{len(data)} bytes is over {max_bytes}")
    return data


def decode(data: bytes, limits: ImageConditioning) -> np.ndarray:
    """Image file bytes -> uint8 (H, W, 3) RGB, EXIF orientation applied.

    Raises:
        InvalidImage: empty, too large (bytes or pixels), a format not in `limits.formats`, or undecodable.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not data:
        raise InvalidImage("empty")
    if len(data) > limits.max_bytes:
        raise InvalidImage(f"{len(data)} bytes is over {limits.max_bytes}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))  # reads the header only
            fmt = _FORMATS.get(im.format or "", (im.format or "unknown").lower())
            if fmt not in limits.formats:
                raise InvalidImage(f"format {fmt!r} is not accepted; send one of {list(limits.formats)}")
            w, h = im.size
            if w * h > limits.max_pixels:
                raise InvalidImage(f"{w}x{h} is over {limits.max_pixels} pixels")
            im = ImageOps.exif_transpose(im)
            rgb = _to_rgb(im)
    except InvalidImage:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidImage(f"its declared size is over {limits.max_pixels} pixels (a decompression bomb)") from None
    except UnidentifiedImageError as e:
        raise InvalidImage(f"not a decodable image ({type(e).__name__})") from None
    except (OSError, ValueError, SyntaxError) as e:  # truncated or corrupt files
        raise InvalidImage(f"cannot be decoded: {str(e)[:120]}") from None
    if rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise InvalidImage(f"decoded to an unexpected shape {rgb.shape}")
    return np.ascontiguousarray(rgb)


def _to_rgb(im: object) -> np.ndarray:
    """A decoded Pillow image -> uint8 (H, W, 3); 16- and 32-bit greyscale are scaled to 8 bits, not clipped."""
    mode = im.mode  # type: ignore[attr-defined]
    if mode.startswith("I;16"):
        grey = (np.asarray(im, dtype=np.uint16) >> 8).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    if mode == "I":  # 32-bit integer greyscale (Pillow's mode for some 16-bit PNGs): its values are 0..65535
        grey = (np.clip(np.asarray(im, dtype=np.int64), 0, 65535) >> 8).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    return np.asarray(im.convert("RGB"), dtype=np.uint8)  # type: ignore[attr-defined]


async def decode_async(data: bytes, limits: ImageConditioning) -> np.ndarray:
    """`decode` on a worker thread (the event loop keeps serving)."""
    return await asyncio.get_running_loop().run_in_executor(None, decode, data, limits)
