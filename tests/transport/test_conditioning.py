"""A starting image as a session's conditioning, and a model's declared actions, against a real server on loopback
serving the FAKE image-conditioned `PaletteWorld` (tests/fake_models.py): JSON and multipart images, precise 4xx
for every bad one with nothing allocated, text refused where the model takes none, frames over real WebRTC
showing the image's colour and reacting to the model's own keys and mouse axis."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest

from tests.conftest import _serve, server_config
from tests.fake_models import PaletteWorld, png, register_fake_family
from worldcast.transport.clients import UnknownKey, WebRTCClient

register_fake_family()
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def palette():  # type: ignore[no-untyped-def]
    yield from _serve(server_config(model="fake-palette", video_scale=1), PaletteWorld())


@pytest.fixture
def http(palette):  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=palette.url, timeout=30) as c:
        yield c


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_the_model_declares_its_actions_and_conditioning(http: httpx.Client) -> None:
    m = http.get("/v1/model").json()
    assert m["actions"]["keys"] == ["q", "e"] and m["keys"] == ["q", "e"]
    assert m["actions"]["key_labels"] == {"q": "darker", "e": "brighter"}
    assert [a["name"] for a in m["actions"]["mouse"]] == ["yaw"] and m["actions"]["mouse"][0]["scale"] == 0.01
    assert m["actions"]["exclusive_groups"] == [["q", "e"]]
    roll = next(a for a in m["actions"]["axes"] if a["name"] == "roll")
    assert roll["kind"] == "absolute" and roll["range"] == [-90, 90] and roll["rest"] == 0
    assert m["actions"]["bindings"] == {"mouse.x": "yaw"}
    assert m["conditioning"]["text"] is None and m["default_prompt"] is None
    img = m["conditioning"]["image"]
    assert img["required"] and img["default"] is None and img["formats"] == ["png", "jpeg"]


def test_the_registry_is_listed_with_the_served_variant_marked(http: httpx.Client) -> None:
    fams = {f["name"]: f for f in http.get("/v1/models").json()}
    assert {"tinyworld", "causal-wan", "fake-palette"} <= set(fams)
    assert fams["fake-palette"]["served"] == "default" and fams["tinyworld"]["served"] is None
    wan = fams["causal-wan"]
    assert {v["name"] for v in wan["variants"]} >= {"1.3b", "tiny"} and wan["default_variant"] == "1.3b"
    assert {o["name"] for o in wan["options"]} >= {"wan-preset", "wan-base"}
    tiny = next(v for v in wan["variants"] if v["name"] == "tiny")
    assert tiny["random_weights"] and tiny["conditioning"]["text"] is not None and tiny["actions"]["mouse"] == []


BAD = [
    ({}, "image: this model needs a starting image"),
    ({"image": b64(png((1, 2, 3))), "prompt": "a field"}, "prompt: this model takes no text prompt"),
    ({"image": "not base64!!"}, "image: not valid base64"),
    ({"image": b64(b"hello world, no picture")}, "image: not a decodable image"),
    ({"image": b64(png((1, 2, 3), fmt="GIF"))}, "image: format 'gif' is not accepted"),
    ({"image": b64(png((1, 2, 3), size=(200, 100)))}, "image: 200x100 is over 16384 pixels"),
    ({"image": "data:text/plain;base64," + b64(png((1, 2, 3)))}, "image: a data URL must be"),
    ({"image": b64(png((1, 2, 3))), "mode": "directing"}, "mode: directing needs text directions"),
    ({"image": b64(png((1, 2, 3))[:40])}, "image: "),  # a truncated file
]


@pytest.mark.parametrize("body, detail", BAD, ids=[d.split(":")[0] + str(i) for i, (_, d) in enumerate(BAD)])
def test_a_bad_conditioning_is_a_precise_422_and_allocates_nothing(palette, http, body, detail) -> None:  # type: ignore[no-untyped-def]
    before = (len(palette.manager.sessions), palette.manager.engines[0].worker.free_slots)
    r = http.post("/v1/sessions", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(detail), r.json()
    assert (len(palette.manager.sessions), palette.manager.engines[0].worker.free_slots) == before


def test_an_image_over_the_model_s_byte_limit_is_refused_before_decoding(http: httpx.Client) -> None:
    huge = b64(bytes(70 * 1024))  # over the model's 64 KiB; base64 of zeros
    r = http.post("/v1/sessions", json={"image": huge})
    assert r.status_code == 422 and "over 65536 bytes" in r.json()["detail"]
    r = http.post("/v1/sessions", content=json.dumps({"image": "A" * 600_000}), headers={
        "Content-Type": "application/json"})
    assert r.status_code == 413  # past the body limit of this model's largest image


def test_multipart_takes_the_image_as_a_file_part(palette, http) -> None:  # type: ignore[no-untyped-def]
    r = http.post("/v1/sessions", files={"image": ("start.png", png((10, 200, 30)), "image/png")},
                  data={"seed": "7", "stamp_frames": "false"})
    assert r.status_code == 201, r.text
    s = r.json()
    info = http.get(f"/v1/sessions/{s['session_id']}", headers={"Authorization": f"Bearer {s['token']}"}).json()
    assert info["image"] == {"width": 8, "height": 8} and info["prompt"] is None
    http.delete(f"/v1/sessions/{s['session_id']}", headers={"Authorization": f"Bearer {s['token']}"})
    r = http.post("/v1/sessions", files={"image": ("a.png", png((1, 2, 3)), "image/png")}, data={"colour": "red"})
    assert r.status_code == 422 and "colour" in r.text
    r = http.post("/v1/sessions", files={"other": ("a.txt", b"x", "text/plain")})
    assert r.status_code == 422


def test_text_content_types_are_refused_with_415(http: httpx.Client) -> None:
    r = http.post("/v1/sessions", content=b'{"image": "x"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def _mean_rgb(frame) -> np.ndarray:  # type: ignore[no-untyped-def]
    return frame.to_ndarray(format="rgb24").reshape(-1, 3).mean(0)


class Latest:
    """Reads the track continuously and keeps the newest frame's mean colour (aiortc queues every frame)."""

    def __init__(self, c: WebRTCClient) -> None:
        self.c, self.mean, self.count = c, np.zeros(3), 0
        self.arrived = asyncio.Condition()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        from aiortc.mediastreams import MediaStreamError

        while True:
            try:
                f = await self.c.next_frame(timeout_s=60)
            except MediaStreamError:  # the track ended (the client closed)
                return
            async with self.arrived:
                self.mean, self.count = _mean_rgb(f), self.count + 1
                self.arrived.notify_all()

    async def after(self, frames: int) -> np.ndarray:
        """The mean colour once `frames` more frames have arrived."""
        async with self.arrived:
            end = self.count + frames
            await self.arrived.wait_for(lambda: self.count >= end)
            return self.mean


async def test_the_image_reaches_the_pixels_and_the_model_s_own_keys_and_mouse_steer_it(palette) -> None:  # type: ignore[no-untyped-def]
    async with await WebRTCClient.connect(palette.url, image=png((40, 120, 200))) as c:
        assert c.model["actions"]["keys"] == ["q", "e"]
        video = Latest(c)
        try:
            start = await asyncio.wait_for(video.after(8), 60)
            assert np.abs(start - [40, 120, 200]).max() < 12, start  # VP8 keeps a flat colour within a few levels
            with pytest.raises(UnknownKey, match="'w' is not in fake-palette's action space"):
                c.send_action(keys=["w"])  # refused locally, nothing sent
            c.send_raw_action(json.dumps({"seq": 1, "t": 0, "keys": ["w"], "mouse": [0, 0]}))
            ev = await c.wait_event(lambda e: e.get("event") == "action_rejected", timeout_s=10)
            assert "unknown key 'w'" in ev["message"]
            with pytest.raises(ValueError, match="roll"):
                c.send_action(keys=[], axes={"roll": 100.0})  # refused locally: outside the declared range
            c.send_raw_action(json.dumps({"seq": 2, "t": 0, "keys": [], "axes": {"roll": 100}}))
            ev = await c.wait_event(lambda e: e.get("event") == "action_rejected" and e.get("seq") == 2, timeout_s=10)
            assert "axis 'roll' must lie within [-90, 90]" in ev["message"]
            c.send_action(keys=["q"], axes={"roll": 30.0})  # darker: each latent frame takes 10 % of the image's brightness
            darker = await asyncio.wait_for(video.after(12), 60)
            assert darker[2] < start[2] - 30, (start, darker)
            c.send_action(keys=[], mouse=(50.0, 0.0))  # yaw +0.5 (clipped) once: brighter again
            brighter = await asyncio.wait_for(video.after(12), 60)
            assert brighter[2] > darker[2] + 10, (darker, brighter)
            with pytest.raises(Exception, match="takes no text prompt"):
                await c.rpc("set_prompt", {"prompt": "a field"})
        finally:
            video.task.cancel()
            await asyncio.gather(video.task, return_exceptions=True)


def test_multipart_odd_values_are_422_never_500(http: httpx.Client) -> None:
    for seed in ("--1", "\u00b2", "9" * 5000, ""):
        r = http.post("/v1/sessions", files={"image": ("a.png", png((1, 2, 3)), "image/png")}, data={"seed": seed})
        assert r.status_code == 422 and "seed" in r.text, (seed, r.status_code, r.text[:200])
    r = http.post("/v1/sessions", files=[("image", ("a.png", png((1, 2, 3)), "image/png")),
                                         ("prompt", (None, "x")), ("prompt", (None, "y"))])
    assert r.status_code == 422 and "given twice" in r.text


def test_wrapped_base64_and_any_case_data_urls_are_accepted(palette, http) -> None:  # type: ignore[no-untyped-def]
    data = base64.encodebytes(png((5, 6, 7), size=(60, 60))).decode()  # 76-column lines (RFC 2045)
    assert "\n" in data.strip()
    for image in (data, "DATA:Image/PNG;BASE64," + b64(png((5, 6, 7)))):
        r = http.post("/v1/sessions", json={"image": image})
        assert r.status_code == 201, r.text
        s = r.json()
        http.delete(f"/v1/sessions/{s['session_id']}", headers={"Authorization": f"Bearer {s['token']}"})


def test_dreamverse_on_a_model_without_text_says_so_and_closes(palette) -> None:  # type: ignore[no-untyped-def]
    from websockets.sync.client import connect

    with connect(palette.url.replace("http", "ws") + "/ws") as ws:
        ws.send(json.dumps({"type": "session_init_v2", "curated_prompts": ["a meadow"]}))
        events = []
        try:
            while True:
                events.append(json.loads(ws.recv(timeout=20)))
        except Exception:  # noqa: BLE001 - the server closes the socket after its error event
            pass
    err = [e for e in events if e.get("type") == "error"]
    assert err and err[-1]["error_code"] == "unsupported_model" and "takes no text" in err[-1]["message"], events


def test_a_full_server_refuses_an_image_before_decoding_it() -> None:
    """Decoding is the costly part of a create with an image: a server that would refuse the session anyway
    answers 503 without decoding (a picture over the model's pixel limit gets 503 here, not 422)."""
    from dataclasses import replace

    from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy

    cfg = server_config(model="fake-palette", video_scale=1)
    cfg = replace(cfg, sessions=replace(cfg.sessions, admission=AdmissionConfig(policy=AdmissionPolicy.STATIC,
                                                                                max_sessions=1)))
    for srv in _serve(cfg, PaletteWorld()):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            too_big = png((1, 2, 3), size=(200, 200))  # over the fake model's 128 x 128 pixels
            assert c.post("/v1/sessions", json={"image": b64(too_big)}).status_code == 422  # decoded: refused
            assert c.post("/v1/sessions", json={"image": b64(png((1, 2, 3)))}).status_code == 201
            r = c.post("/v1/sessions", json={"image": b64(too_big)})
            assert r.status_code == 503 and "Retry-After" in r.headers, r.text
