"""SDP offer validation: refuse an offer precisely before any peer connection is made or replaced.

`validate_offer` checks what a WebRTC offer to this server must carry, so a
bad offer (or re-offer) is answered 400 with the reason and never reaches
aiortc or the session's live peer:

- the text: UTF-8 lines `<letter>=<value>` (RFC 8866 5), `v=0` first, no control
  characters, at most `MAX_MEDIA_SECTIONS` m-lines;
- a video m-line (`m=video`) the server can send on: direction recvonly or sendrecv
  (RFC 8866 6.7), port not 0 unless `a=bundle-only` (RFC 8843 6);
- transport profiles of JSEP (RFC 8829 5.1.2): `UDP/TLS/RTP/SAVPF` for audio and video
  (DTLS-SRTP, RFC 5764), `UDP/DTLS/SCTP` or `DTLS/SCTP` for the data channel m-line
  (RFC 8841 4.1); anything else, `RTP/AVP` included, is refused;
- in every m-section (or at session level): `a=fingerprint` with a known hash function and
  a digest of its length (RFC 8122 5), `a=ice-ufrag` (4-256 ice-chars) and `a=ice-pwd`
  (22-256 ice-chars) (RFC 8839 5.4), `a=setup` actpass/active/passive (RFC 4145 4, RFC 8842 5.2),
  and `a=rtcp-mux` on RTP sections (RFC 8829 5.2.1);
- ICE candidates in the offer (no trickle ICE here: offer after gathering completes), at
  most `MAX_CANDIDATES` of them (each is a connectivity-check target).

Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from worldcast.transport.errors import InvalidOffer

#: Largest number of m-lines in an offer (the client needs one video and one application line).
MAX_MEDIA_SECTIONS = 8
#: Largest number of ICE candidates in an offer: the server sends connectivity checks to each.
MAX_CANDIDATES = 32
#: Digest length of each `a=fingerprint` hash function, bytes (RFC 8122 5, hash names of RFC 3279).
FINGERPRINT_BYTES = {"sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64}
#: Allowed transport protocols per media type (JSEP, RFC 8829 5.1.2 and 5.1.3).
PROTOCOLS = {
    "video": ("UDP/TLS/RTP/SAVPF",),
    "audio": ("UDP/TLS/RTP/SAVPF",),
    "application": ("UDP/DTLS/SCTP", "DTLS/SCTP"),
}

_LINE = re.compile(r"[a-z]=.*")
_ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")
_HEX_PAIRS = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2})*")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class OfferSummary:
    """What a valid offer asks for.

    Attributes:
        video_sections: m-line indices (0-based) of the video sections the server can send on.
        data_channel: whether the offer has an application (SCTP data channel) m-line.
        candidates: ICE candidates in the offer.
    """

    video_sections: tuple[int, ...]
    data_channel: bool
    candidates: int


@dataclass
class _Section:
    index: int
    media: str
    port: str
    proto: str
    attrs: list[tuple[str, str]]

    def get(self, name: str) -> list[str]:
        return [v for k, v in self.attrs if k == name]

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self.attrs)


def _attr(value: str) -> tuple[str, str]:
    name, _, rest = value.partition(":")
    return name, rest


def _parse(sdp: str) -> tuple[list[tuple[str, str]], list[_Section]]:
    lines = sdp.split("\n")
    if lines and lines[-1] in ("", "\r"):
        lines.pop()
    if not lines:
        raise InvalidOffer("invalid SDP offer: empty")
    session: list[tuple[str, str]] = []
    sections: list[_Section] = []
    for n, raw in enumerate(lines, 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        bad = _CONTROL.search(line)
        if bad:
            raise InvalidOffer(f"invalid SDP offer: line {n} contains control character U+{ord(bad.group()):04X}")
        if not _LINE.fullmatch(line):
            raise InvalidOffer(f"invalid SDP offer: line {n} is not '<letter>=<value>' (RFC 8866 5)")
        if n == 1 and line != "v=0":
            raise InvalidOffer("invalid SDP offer: the first line must be 'v=0'")
        kind, value = line[0], line[2:]
        if kind == "m":
            parts = value.split(" ")
            if len(parts) < 4 or not parts[1].split("/")[0].isdigit():
                raise InvalidOffer(f"invalid SDP offer: m-line {len(sections)} is not "
                                   "'m=<media> <port> <proto> <fmt> ...' (RFC 8866 5.14)")
            if len(sections) == MAX_MEDIA_SECTIONS:
                raise InvalidOffer(f"invalid SDP offer: more than {MAX_MEDIA_SECTIONS} m-lines")
            sections.append(_Section(len(sections), parts[0], parts[1].split("/")[0], parts[2], []))
        elif kind == "a":
            (sections[-1].attrs if sections else session).append(_attr(value))
    return session, sections


def _one(section: _Section, session: list[tuple[str, str]], name: str) -> str | None:
    vals = section.get(name) or [v for k, v in session if k == name]
    return vals[0] if vals else None


def _check_transport(s: _Section, session: list[tuple[str, str]]) -> None:
    where = f"m-line {s.index} ({s.media})"
    fps = s.get("fingerprint") or [v for k, v in session if k == "fingerprint"]
    if not fps:
        raise InvalidOffer(f"invalid SDP offer: {where} has no a=fingerprint (DTLS is required; RFC 8122)")
    for fp in fps:
        algo, _, digest = fp.strip().partition(" ")
        algo = algo.lower()
        if algo not in FINGERPRINT_BYTES:
            raise InvalidOffer(f"invalid SDP offer: {where}: fingerprint hash {algo[:20]!r} is not one of "
                               f"{sorted(FINGERPRINT_BYTES)}")
        digest = digest.strip()
        if not _HEX_PAIRS.fullmatch(digest) or len(digest.split(":")) != FINGERPRINT_BYTES[algo]:
            raise InvalidOffer(f"invalid SDP offer: {where}: {algo} fingerprint must be "
                               f"{FINGERPRINT_BYTES[algo]} colon-separated hex bytes")
    ufrag, pwd = _one(s, session, "ice-ufrag"), _one(s, session, "ice-pwd")
    for name, value in (("ice-ufrag", ufrag), ("ice-pwd", pwd)):
        if value is None:
            raise InvalidOffer(f"invalid SDP offer: {where} has no a={name} (RFC 8839 5.4)")
    assert ufrag is not None and pwd is not None
    if not (4 <= len(ufrag) <= 256 and _ICE_CHARS.fullmatch(ufrag)):
        raise InvalidOffer(f"invalid SDP offer: {where}: ice-ufrag must be 4-256 of A-Z a-z 0-9 + /")
    if not (22 <= len(pwd) <= 256 and _ICE_CHARS.fullmatch(pwd)):
        raise InvalidOffer(f"invalid SDP offer: {where}: ice-pwd must be 22-256 of A-Z a-z 0-9 + /")
    setups = s.get("setup") or [v for k, v in session if k == "setup"]
    if not setups:
        raise InvalidOffer(f"invalid SDP offer: {where} has no a=setup (DTLS role; RFC 8842 5.2: actpass)")
    if any(v.strip() not in ("actpass", "active", "passive") for v in setups):
        raise InvalidOffer(f"invalid SDP offer: {where}: a=setup must be actpass, active or passive (RFC 4145)")
    if s.media != "application" and not (s.has("rtcp-mux") or any(k == "rtcp-mux" for k, _ in session)):
        raise InvalidOffer(f"invalid SDP offer: {where} has no a=rtcp-mux (required by WebRTC; RFC 8829 5.2.1)")


def validate_offer(sdp: str) -> OfferSummary:
    """Check an SDP offer before anything is negotiated.

    Args:
        sdp: the offer text (CRLF or LF line ends).

    Returns:
        What the offer asks for.

    Raises:
        InvalidOffer: the first rule it breaks (see the module docstring), in one line.
    """
    session, sections = _parse(sdp)
    if not sections:
        raise InvalidOffer("invalid SDP offer: no m-lines (offer a recvonly video transceiver)")
    video: list[int] = []
    direction_seen = ""
    candidates = 0
    for s in sections:
        allowed = PROTOCOLS.get(s.media)
        if allowed is None:
            raise InvalidOffer(f"invalid SDP offer: m-line {s.index}: media {s.media[:20]!r} is not "
                               f"one of {sorted(PROTOCOLS)}")
        if s.proto not in allowed:
            raise InvalidOffer(f"invalid SDP offer: m-line {s.index} ({s.media}): transport {s.proto[:40]!r} is "
                               f"not {' or '.join(allowed)} (WebRTC needs DTLS-SRTP / SCTP over DTLS)")
        if s.port == "0" and not s.has("bundle-only"):
            continue  # a rejected or stopped section (RFC 8866 5.14): nothing to negotiate
        _check_transport(s, session)
        candidates += len(s.get("candidate"))
        if s.media == "video":
            dirs = [k for k, _ in s.attrs if k in ("sendrecv", "sendonly", "recvonly", "inactive")]
            d = dirs[-1] if dirs else next((k for k, _ in session if k in (
                "sendrecv", "sendonly", "recvonly", "inactive")), "sendrecv")
            if d in ("recvonly", "sendrecv"):
                video.append(s.index)
            else:
                direction_seen = d
    if not video:
        if direction_seen:
            raise InvalidOffer(f"invalid SDP offer: the video m-line is {direction_seen}: offer recvonly video")
        raise InvalidOffer("invalid SDP offer: no video m-line (offer a recvonly video transceiver)")
    candidates += sum(1 for k, _ in session if k == "candidate")
    if candidates == 0:
        raise InvalidOffer("invalid SDP offer: no ICE candidates (no trickle ICE: offer after gathering completes)")
    if candidates > MAX_CANDIDATES:
        raise InvalidOffer(f"invalid SDP offer: {candidates} ICE candidates, more than {MAX_CANDIDATES}")
    return OfferSummary(video_sections=tuple(video), data_channel=any(s.media == "application" for s in sections),
                        candidates=candidates)
