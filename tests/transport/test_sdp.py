"""Offer validation (transport/webrtc/sdp.py) on a real aiortc offer and on its broken variants."""

from __future__ import annotations

import asyncio
import re

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from worldcast.transport.errors import InvalidOffer
from worldcast.transport.webrtc.peer import configure_ice
from worldcast.transport.webrtc.sdp import MAX_CANDIDATES, validate_offer


def real_offer(*, data_channel: bool = True, direction: str = "recvonly") -> str:
    """An offer from a real aiortc peer, as the project's client makes it."""

    async def make() -> str:
        configure_ice(["127.0.0.1"])
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            if data_channel:
                pc.createDataChannel("actions")
            pc.addTransceiver("video", direction=direction)
            await pc.setLocalDescription(await pc.createOffer())
            return pc.localDescription.sdp
        finally:
            await pc.close()

    return asyncio.run(make())


@pytest.fixture(scope="module")
def offer() -> str:
    return real_offer()


def test_a_real_offer_passes(offer: str) -> None:
    s = validate_offer(offer)
    assert s.video_sections == (0,) and s.data_channel and s.candidates >= 2
    assert validate_offer(offer.replace("\r\n", "\n")) == s  # LF line ends too


def test_video_only_offer_passes() -> None:
    assert not validate_offer(real_offer(data_channel=False)).data_channel


def _drop(sdp: str, prefix: str) -> str:
    return "".join(line for line in sdp.splitlines(keepends=True) if not line.startswith(prefix))


@pytest.mark.parametrize("mutate, needle", [
    (lambda s: _drop(s, "a=fingerprint"), "no a=fingerprint"),
    (lambda s: s.replace("UDP/TLS/RTP/SAVPF", "RTP/AVP"), "'RTP/AVP' is not UDP/TLS/RTP/SAVPF"),
    (lambda s: s.replace("UDP/DTLS/SCTP", "UDP/SCTP"), "'UDP/SCTP' is not UDP/DTLS/SCTP or DTLS/SCTP"),
    (lambda s: _drop(s, "a=ice-ufrag"), "no a=ice-ufrag"),
    (lambda s: _drop(s, "a=ice-pwd"), "no a=ice-pwd"),
    (lambda s: re.sub(r"a=ice-pwd:\S+", "a=ice-pwd:short", s), "ice-pwd must be 22-256"),
    (lambda s: re.sub(r"a=ice-ufrag:\S+", "a=ice-ufrag:a b", s), "ice-ufrag must be"),
    (lambda s: s.replace("sha-256 ", "md5 "), "fingerprint hash 'md5'"),
    (lambda s: re.sub(r"(a=fingerprint:sha-256 )\S+", r"\1AB:CD", s), "32 colon-separated hex bytes"),
    (lambda s: s.replace("a=setup:actpass", "a=setup:holdconn"), "a=setup must be"),
    (lambda s: s.replace("a=setup:actpass", "a=setup:actpass\r\na=setup:holdconn", 1), "a=setup must be"),
    (lambda s: _drop(s, "a=setup"), "no a=setup"),
    (lambda s: _drop(s, "a=rtcp-mux"), "no a=rtcp-mux"),
    (lambda s: _drop(s, "a=candidate"), "no ICE candidates"),
    (lambda s: s.replace("m=video", "m=text"), "media 'text'"),
    (lambda s: _drop(s.replace("m=video", "m=audio"), "zzz"), "no video m-line"),
    (lambda s: s.replace("a=recvonly", "a=sendonly"), "video m-line is sendonly"),
    (lambda s: s.replace("a=recvonly", "a=inactive"), "video m-line is inactive"),
    (lambda s: s.replace("v=0", "v=1", 1), "first line must be 'v=0'"),
    (lambda s: s.replace("s=-", "s=a\x00b"), "control character U+0000"),
    (lambda s: s + "garbage\r\n", "not '<letter>=<value>'"),
    (lambda s: "v=0\r\n", "no m-lines"),
    (lambda s: "", "empty"),
    (lambda s: s.replace("m=video ", "m=video x"), "is not 'm=<media> <port>"),
    (lambda s: s + "".join("m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n" for _ in range(8)), "more than 8"),
    (lambda s: s.replace("a=end-of-candidates", "\r\n".join(
        f"a=candidate:{i} 1 udp 1 127.0.0.{i % 250 + 1} 9 typ host" for i in range(MAX_CANDIDATES)), 1),
     f"more than {MAX_CANDIDATES}"),
])
def test_broken_offers_are_refused_with_the_reason(offer: str, mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidOffer) as e:
        validate_offer(mutate(offer))
    assert needle in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300  # one short line


def test_a_stopped_video_section_does_not_count_but_a_live_one_does(offer: str) -> None:
    stopped = offer.replace("m=video ", "m=video 0 UDP/TLS/RTP/SAVPF 97\r\na=inactive\r\nm=video ", 1)
    assert validate_offer(stopped).video_sections == (1,)  # the port-0 section is skipped, not refused

