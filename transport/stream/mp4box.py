"""A small ISO BMFF (MP4) box writer and reader: the fragment boxes worldcast writes itself.

Why our own writer: FFmpeg's mp4 muxer closes a fragment only when the next
packet arrives (measured in `tests/transport/test_fmp4.py`), which holds every
frame one frame period (50 ms at 20 fps) before it can be sent, and PyAV
exposes no fragment flush. worldcast therefore takes the init segment
(`ftyp` + `moov`) from PyAV's muxer and writes each media segment (`moof` +
`mdat`, one sample) from the encoded packet at once. The subset needed is
five boxes; the Python box libraries (`pymp4`) pin an old `construct` and are
unmaintained, so this is a short, tested writer instead.

Sources: ISO/IEC 14496-12 (ISO base media file format) sections 4.2 (box
header), 8.8.4-8.8.8 and 8.8.12 (`mfhd`, `traf`, `tfhd`, `trun`, `tfdt`),
8.8.3.1 (sample flags); ISO/IEC 14496-15 section 5.3.3 (`avcC`), 5.3.2
(length-prefixed NAL units in samples); ITU-T H.264 section 7.3.2.1.1 (SPS
header bytes), Annex B (start codes); RFC 6381 section 3.3 (`avc1.PPCCLL`);
W3C "ISO BMFF Byte Stream Format" for MSE (init segment: `ftyp` + `moov`;
media segment: `moof` + `mdat`; `default-base-is-moof`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from worldcast.transport.errors import BoxError

#: tfhd flag: base data offset is the start of the enclosing moof (14496-12 8.8.7.1).
TFHD_DEFAULT_BASE_IS_MOOF = 0x020000
#: trun flags (14496-12 8.8.8.1).
TRUN_DATA_OFFSET = 0x000001
TRUN_SAMPLE_DURATION = 0x000100
TRUN_SAMPLE_SIZE = 0x000200
TRUN_SAMPLE_FLAGS = 0x000400
#: Sample flags (14496-12 8.8.3.1): a sync sample depends on no other (sample_depends_on = 2) ...
SYNC_SAMPLE_FLAGS = 0x02000000
#: ... a non-sync sample depends on others (sample_depends_on = 1) and is_non_sync_sample = 1.
NON_SYNC_SAMPLE_FLAGS = 0x01010000

#: Boxes whose payload is a sequence of boxes (the ones this module walks into).
CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl", b"mvex", b"moof", b"traf", b"dinf", b"edts"})

#: H.264 NAL unit types (H.264 Table 7-1).
NAL_IDR, NAL_SEI, NAL_SPS, NAL_PPS, NAL_AUD = 5, 6, 7, 8, 9


# -- writing -----------------------------------------------------------------------------------------


def box(kind: bytes, *payload: bytes) -> bytes:
    """One box: 32-bit size, 4-character type, payload (14496-12 4.2).

    Raises:
        ValueError: `kind` is not 4 bytes or the box would pass 4 GiB.
    """
    if len(kind) != 4:
        raise ValueError(f"box type must be 4 bytes, got {kind!r}")
    body = b"".join(payload)
    if len(body) + 8 > 0xFFFFFFFF:
        raise ValueError("box over 4 GiB (64-bit sizes are not written)")
    return struct.pack(">I4s", len(body) + 8, kind) + body


def full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    """A full box: a box whose payload starts with version (8 bits) and flags (24 bits)."""
    return box(kind, struct.pack(">I", (version << 24) | (flags & 0xFFFFFF)), *payload)


@dataclass(frozen=True)
class Sample:
    """One media sample (here: one coded video frame).

    Attributes:
        data: the sample bytes; for H.264, length-prefixed NAL units (4-byte lengths).
        duration: in track timescale units.
        sync: True for a sync sample (an IDR picture: decodable on its own).
    """

    data: bytes
    duration: int
    sync: bool


def media_segment(*, sequence_number: int, track_id: int, base_decode_time: int, samples: list[Sample]) -> bytes:
    """A media segment: `moof` (mfhd, traf: tfhd, tfdt, trun) and `mdat` carrying `samples`.

    Decode and presentation times coincide (no composition offsets: streams
    without B-frames). The tfhd uses default-base-is-moof and the trun's data
    offset points just past the mdat header, as MSE requires.

    Args:
        sequence_number: mfhd sequence number, >= 1, increasing per fragment.
        track_id: the track in the init segment (1 for a one-track movie).
        base_decode_time: decode time of the first sample, track timescale units (64-bit tfdt).
        samples: at least one.

    Returns:
        the segment's bytes (moof followed by mdat).

    Raises:
        ValueError: no samples, or a field out of range.
    """
    if not samples:
        raise ValueError("a media segment needs at least one sample")
    if sequence_number < 1 or base_decode_time < 0 or track_id < 1:
        raise ValueError("sequence_number and track_id must be >= 1, base_decode_time >= 0")
    mfhd = full_box(b"mfhd", 0, 0, struct.pack(">I", sequence_number))
    tfhd = full_box(b"tfhd", 0, TFHD_DEFAULT_BASE_IS_MOOF, struct.pack(">I", track_id))
    tfdt = full_box(b"tfdt", 1, 0, struct.pack(">Q", base_decode_time))
    flags = TRUN_DATA_OFFSET | TRUN_SAMPLE_DURATION | TRUN_SAMPLE_SIZE | TRUN_SAMPLE_FLAGS
    entries = b"".join(struct.pack(">III", s.duration, len(s.data), SYNC_SAMPLE_FLAGS if s.sync
                                   else NON_SYNC_SAMPLE_FLAGS) for s in samples)
    # trun: sample_count, data_offset, then per sample (duration, size, flags)
    trun_size = 8 + 4 + 4 + 4 + len(entries)
    moof_size = 8 + len(mfhd) + 8 + len(tfhd) + len(tfdt) + trun_size
    data_offset = moof_size + 8  # from the moof's first byte to the first sample, past the mdat header
    trun = full_box(b"trun", 0, flags, struct.pack(">Ii", len(samples), data_offset), entries)
    moof = box(b"moof", mfhd, box(b"traf", tfhd, tfdt, trun))
    assert len(moof) == moof_size, (len(moof), moof_size)
    return moof + box(b"mdat", *(s.data for s in samples))


# -- reading -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """Where a box lies in a buffer: type, offset of its header, header size and total size (bytes)."""

    kind: bytes
    offset: int
    header_size: int
    size: int

    @property
    def payload_offset(self) -> int:
        return self.offset + self.header_size

    @property
    def end(self) -> int:
        return self.offset + self.size


def iter_boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[Box]:
    """The boxes laid end to end in data[start:end] (not descending into them).

    Raises:
        BoxError: a box header is truncated or a size runs past `end`.
    """
    end = len(data) if end is None else end
    o = start
    while o < end:
        if end - o < 8:
            raise BoxError(f"truncated box header at byte {o}")
        size, kind = struct.unpack_from(">I4s", data, o)
        header = 8
        if size == 1:
            if end - o < 16:
                raise BoxError(f"truncated 64-bit box size at byte {o}")
            size, header = struct.unpack_from(">Q", data, o + 8)[0], 16
        elif size == 0:
            size = end - o  # the box runs to the end of the buffer
        if size < header or o + size > end:
            raise BoxError(f"box {kind!r} at byte {o} has size {size}, past the end ({end})")
        yield Box(kind, o, header, size)
        o += size


def find_box(data: bytes, path: list[bytes], start: int = 0, end: int | None = None) -> Box | None:
    """The first box at `path` (e.g. [b"moov", b"trak", b"mdia", b"mdhd"]), or None."""
    for b in iter_boxes(data, start, end):
        if b.kind == path[0]:
            if len(path) == 1:
                return b
            found = find_box(data, path[1:], b.payload_offset, b.end)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class InitInfo:
    """What a reader needs from an init segment.

    Attributes:
        track_id: of the (first) track.
        timescale: media timescale of the track, units per second (mdhd).
        movie_duration: mvhd duration (0: unknown, a live stream).
        has_mehd: whether the movie declares a fragment duration (mvex/mehd; absent for live).
        avcc: the AVCDecoderConfigurationRecord (payload of avcC), or None when not H.264.
        width, height: visual sample entry size, pixels.
    """

    track_id: int
    timescale: int
    movie_duration: int
    has_mehd: bool
    avcc: bytes | None
    width: int
    height: int


def parse_init(data: bytes) -> InitInfo:
    """Read an init segment (`ftyp` + `moov`).

    Raises:
        BoxError: not an init segment with one video track.
    """
    if find_box(data, [b"ftyp"]) is None:
        raise BoxError("init segment has no ftyp")

    def need(path: list[bytes]) -> Box:
        b = find_box(data, path)
        if b is None:
            raise BoxError(f"init segment has no {'/'.join(p.decode() for p in path)}")
        return b

    mvhd, tkhd = need([b"moov", b"mvhd"]), need([b"moov", b"trak", b"tkhd"])
    mdhd = need([b"moov", b"trak", b"mdia", b"mdhd"])
    stsd = need([b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stsd"])
    v_mvhd, v_tkhd, v_mdhd = data[mvhd.payload_offset], data[tkhd.payload_offset], data[mdhd.payload_offset]
    p = mvhd.payload_offset + 4
    duration = struct.unpack_from(">Q", data, p + 20)[0] if v_mvhd == 1 else struct.unpack_from(">I", data, p + 12)[0]
    p = tkhd.payload_offset + 4
    track_id = struct.unpack_from(">I", data, p + (16 if v_tkhd == 1 else 8))[0]
    p = mdhd.payload_offset + 4
    timescale = struct.unpack_from(">I", data, p + (16 if v_mdhd == 1 else 8))[0]
    # stsd: full box header, entry_count, then sample entries (boxes)
    entries = list(iter_boxes(data, stsd.payload_offset + 8, stsd.end))
    if not entries:
        raise BoxError("stsd has no sample entry")
    entry = entries[0]
    # VisualSampleEntry (14496-12 12.1.3): 8 bytes SampleEntry, 16 predefined/reserved, width, height, ...
    width, height = struct.unpack_from(">HH", data, entry.payload_offset + 24)
    avcc = None
    if entry.kind in (b"avc1", b"avc3"):
        b = find_box(data, [b"avcC"], entry.payload_offset + 78, entry.end)
        avcc = data[b.payload_offset:b.end] if b is not None else None
    return InitInfo(track_id=track_id, timescale=timescale, movie_duration=duration,
                    has_mehd=find_box(data, [b"moov", b"mvex", b"mehd"]) is not None,
                    avcc=avcc, width=width, height=height)


@dataclass(frozen=True)
class MediaSegmentInfo:
    """A parsed media segment: its sequence number, base decode time and samples."""

    sequence_number: int
    base_decode_time: int
    samples: list[Sample]


def parse_media_segment(data: bytes) -> MediaSegmentInfo:
    """Read one `moof` + `mdat` as written by `media_segment` (one traf, one trun with sizes).

    Raises:
        BoxError: not such a media segment.
    """
    boxes = list(iter_boxes(data))
    if len(boxes) != 2 or boxes[0].kind != b"moof" or boxes[1].kind != b"mdat":
        raise BoxError(f"a media segment is moof + mdat, got {[b.kind for b in boxes]}")
    moof = boxes[0]
    mfhd = find_box(data, [b"mfhd"], moof.payload_offset, moof.end)
    tfdt = find_box(data, [b"traf", b"tfdt"], moof.payload_offset, moof.end)
    trun = find_box(data, [b"traf", b"trun"], moof.payload_offset, moof.end)
    if mfhd is None or tfdt is None or trun is None:
        raise BoxError("moof lacks mfhd, tfdt or trun")
    seq = struct.unpack_from(">I", data, mfhd.payload_offset + 4)[0]
    v = data[tfdt.payload_offset]
    bdt = struct.unpack_from(">Q" if v == 1 else ">I", data, tfdt.payload_offset + 4)[0]
    flags = struct.unpack_from(">I", data, trun.payload_offset)[0] & 0xFFFFFF
    need = TRUN_DATA_OFFSET | TRUN_SAMPLE_DURATION | TRUN_SAMPLE_SIZE | TRUN_SAMPLE_FLAGS
    if flags & need != need or flags & ~need:
        raise BoxError(f"trun flags {flags:#08x}: expected exactly {need:#08x}")
    count, offset = struct.unpack_from(">Ii", data, trun.payload_offset + 4)
    pos, samples = moof.offset + offset, []
    for i in range(count):
        duration, size, sflags = struct.unpack_from(">III", data, trun.payload_offset + 12 + 12 * i)
        if pos + size > len(data):
            raise BoxError("trun sample sizes run past the mdat")
        samples.append(Sample(data[pos:pos + size], duration, sync=not sflags & 0x00010000))
        pos += size
    return MediaSegmentInfo(seq, bdt, samples)


# -- H.264 -----------------------------------------------------------------------------------------


def split_annexb(data: bytes) -> list[bytes]:
    """NAL units of an Annex B byte stream (start codes 00 00 01 or 00 00 00 01), without start codes."""
    out: list[bytes] = []
    i, n, start = 0, len(data), -1
    while i + 2 < n:
        if data[i] == 0 and data[i + 1] == 0 and data[i + 2] == 1:
            if start >= 0:  # trailing zero bytes belong to the byte stream (Annex B trailing_zero_8bits)
                out.append(data[start:i].rstrip(b"\x00"))
            i += 3
            start = i
        else:
            i += 1
    if start >= 0:
        out.append(data[start:].rstrip(b"\x00"))
    return [u for u in out if u]


def annexb_to_avcc(data: bytes, *, drop: frozenset[int] = frozenset({NAL_AUD, NAL_SPS, NAL_PPS})) -> bytes:
    """Convert an Annex B access unit to length-prefixed NAL units (4-byte lengths, 14496-15 5.3.2).

    Args:
        drop: NAL unit types left out (by default AUD, SPS and PPS: parameter sets travel in avcC).
    """
    return b"".join(struct.pack(">I", len(u)) + u for u in split_annexb(data) if u[0] & 0x1F not in drop)


def avcc_to_annexb(sample: bytes, *, before: tuple[bytes, ...] = ()) -> bytes:
    """Convert length-prefixed NAL units (4-byte lengths) to an Annex B access unit (start codes 00 00 00 01,
    H.264 Annex B.1), as RTP packetizers and decoders without an avcC take it.

    Args:
        before: NAL units put first (an IDR's SPS and PPS, `parameter_sets_from_avcc`: a receiver joining at
            that IDR has no other way to get them).

    Raises:
        BoxError: a length runs past the sample.
    """
    units, o = list(before), 0
    while o < len(sample):
        if o + 4 > len(sample):
            raise BoxError("truncated NAL length")
        n = struct.unpack_from(">I", sample, o)[0]
        if n == 0 or o + 4 + n > len(sample):
            raise BoxError(f"NAL length {n} at byte {o} runs past the sample")
        units.append(sample[o + 4:o + 4 + n])
        o += 4 + n
    return b"".join(b"\x00\x00\x00\x01" + u for u in units)


def avcc_nal_types(sample: bytes) -> list[int]:
    """NAL unit types of a length-prefixed sample (4-byte lengths).

    Raises:
        BoxError: a length runs past the sample.
    """
    types, o = [], 0
    while o < len(sample):
        if o + 4 > len(sample):
            raise BoxError("truncated NAL length")
        n = struct.unpack_from(">I", sample, o)[0]
        if n == 0 or o + 4 + n > len(sample):
            raise BoxError(f"NAL length {n} at byte {o} runs past the sample")
        types.append(sample[o + 4] & 0x1F)
        o += 4 + n
    return types


def avc_codec_string(sps: bytes) -> str:
    """RFC 6381 codec string `avc1.PPCCLL` from an SPS NAL unit (with its 1-byte NAL header).

    PP = profile_idc, CC = the constraint flags byte, LL = level_idc: the three
    bytes after the NAL header (H.264 7.3.2.1.1), as hex.

    Raises:
        ValueError: not an SPS NAL unit.
    """
    if len(sps) < 4 or sps[0] & 0x1F != NAL_SPS:
        raise ValueError("not an H.264 SPS NAL unit")
    return "avc1." + sps[1:4].hex().upper()


def sps_from_avcc(avcc: bytes) -> bytes:
    """The first SPS NAL unit of an AVCDecoderConfigurationRecord (14496-15 5.3.3.1).

    Raises:
        BoxError: the record is truncated or carries no SPS.
    """
    if len(avcc) < 8 or avcc[0] != 1:
        raise BoxError("not an AVCDecoderConfigurationRecord (configurationVersion 1)")
    count = avcc[5] & 0x1F
    if count < 1:
        raise BoxError("avcC carries no SPS")
    n = struct.unpack_from(">H", avcc, 6)[0]
    if 8 + n > len(avcc):
        raise BoxError("avcC SPS runs past the record")
    return avcc[8:8 + n]


def parameter_sets_from_avcc(avcc: bytes) -> tuple[bytes, ...]:
    """Every SPS, then every PPS NAL unit of an AVCDecoderConfigurationRecord (14496-15 5.3.3.1), in order.

    Raises:
        BoxError: the record is truncated or carries no SPS or no PPS.
    """
    if len(avcc) < 7 or avcc[0] != 1:
        raise BoxError("not an AVCDecoderConfigurationRecord (configurationVersion 1)")
    units: list[bytes] = []
    o = 5
    for mask, what in ((0x1F, "SPS"), (0xFF, "PPS")):
        if o >= len(avcc):
            raise BoxError(f"avcC ends before its {what} count")
        count, o = avcc[o] & mask, o + 1
        if count < 1:
            raise BoxError(f"avcC carries no {what}")
        for _ in range(count):
            if o + 2 > len(avcc):
                raise BoxError(f"avcC {what} length runs past the record")
            n = struct.unpack_from(">H", avcc, o)[0]
            if o + 2 + n > len(avcc):
                raise BoxError(f"avcC {what} runs past the record")
            units.append(avcc[o + 2:o + 2 + n])
            o += 2 + n
    return tuple(units)
