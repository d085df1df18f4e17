"""Starting-image decoding (transport/http/images.py): limits before work, every Pillow mode to 8-bit RGB."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from worldcast.models.spec import ImageConditioning
from worldcast.transport.errors import InvalidImage
from worldcast.transport.http import images

LIMITS = ImageConditioning(required=False, max_bytes=2**20, max_pixels=512 * 512)


def encode(im: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("mode, value, grey", [("I;16", 32768, 128), ("I;16", 65535, 255), ("L", 77, 77),
                                               ("1", 1, 255)])
def test_greyscale_of_any_depth_is_scaled_not_clipped(mode: str, value: int, grey: int) -> None:
    arr = np.full((4, 4), value, np.uint16 if mode == "I;16" else np.int32 if mode == "I" else np.uint8)
    im = Image.fromarray(arr.astype(bool) if mode == "1" else arr, mode=None)
    rgb = images.decode(encode(im), LIMITS)
    assert rgb.dtype == np.uint8 and rgb.shape == (4, 4, 3)
    assert abs(int(rgb[0, 0, 0]) - grey) <= 1, (mode, rgb[0, 0])


def test_palette_alpha_and_cmyk_become_rgb() -> None:
    pal = Image.new("P", (3, 3))
    pal.putpalette([10, 20, 30] * 256)
    assert tuple(images.decode(encode(pal), LIMITS)[0, 0]) == (10, 20, 30)
    rgba = Image.new("RGBA", (3, 3), (200, 100, 0, 128))
    assert tuple(images.decode(encode(rgba), LIMITS)[0, 0]) == (200, 100, 0)
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))
    r, g, b = images.decode(encode(cmyk, "JPEG"), LIMITS)[4, 4]
    assert r > 200 and g < 60 and b < 60  # red


def test_limits_come_before_the_work() -> None:
    with pytest.raises(InvalidImage, match="600x600 is over 262144 pixels"):
        images.decode(encode(Image.new("L", (600, 600))), LIMITS)
    with pytest.raises(InvalidImage, match="over 1000 bytes once decoded"):
        images.from_base64("A" * 2000, max_bytes=1000)
    with pytest.raises(InvalidImage, match="format 'gif'"):
        images.decode(encode(Image.new("L", (2, 2)), "GIF"), LIMITS)
    assert images.from_base64(" aGVs\r\nbG8= \n", max_bytes=100) == b"hello"  # MIME line breaks
