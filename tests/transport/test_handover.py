"""Handing over control (issue 33): the session's own token gives control to one of its viewers and takes it back;
one controller at a time (the previous controller's stream closes, its token then controls nothing); a viewer
holding control that is revoked gives it back; spectators watch on through it all. Over the real server."""

from __future__ import annotations

import asyncio

import httpx

from tests.conftest import _serve, server_config
from worldcast.transport.clients.stream import StreamClient


async def _walk(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"seed": 2})
        sid, owner, model = r.json()["session_id"], r.json()["token"], r.json()["model"]

        def auth(tok: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {tok}"}

        async def flush(tok: str) -> int:
            return (await http.post(f"/v1/sessions/{sid}/rpc", headers=auth(tok),
                                    json={"id": 1, "method": "flush"})).status_code

        async def control(tok: str, to: str | None) -> httpx.Response:
            return await http.post(f"/v1/sessions/{sid}/control", headers=auth(tok), json={"to": to})

        v = (await http.post(f"/v1/sessions/{sid}/viewers", headers=auth(owner))).json()
        w = (await http.post(f"/v1/sessions/{sid}/viewers", headers=auth(owner))).json()
        mine = await StreamClient.attach(url, sid, owner, model=model)
        watcher = await StreamClient.attach(url, sid, w["viewer_token"], model=model)
        try:
            await mine.next_frame()
            await watcher.next_frame()
            assert (await control(w["viewer_token"], w["viewer_id"])).status_code == 404, "a viewer cannot take it"
            assert (await control(owner, "vnobody")).status_code == 404
            r = await control(owner, v["viewer_id"])
            assert r.status_code == 200 and r.json() == {"controller": v["viewer_id"]}
            ev = await mine.wait_event(lambda e: e.get("code") == "control_handed_over", timeout_s=10, past=True)
            assert v["viewer_id"] in ev["message"]
            assert await flush(owner) == 404 and await flush(v["viewer_token"]) == 200, "one controller at a time"
            # the new controller acts on its own stream; the watcher's goes on throughout
            theirs = await StreamClient.attach(url, sid, v["viewer_token"], model=model)
            try:
                seq = await theirs.send_action(keys=["d"])
                while (await theirs.next_frame()).action_seq < seq:
                    pass
                n = (await watcher.next_frame()).frame_index
                assert (await watcher.next_frame()).frame_index > n
                # the owner takes it back at any time
                assert (await control(owner, None)).status_code == 200
                await theirs.wait_event(lambda e: e.get("code") == "control_handed_over", timeout_s=10, past=True)
            finally:
                await theirs.aclose(delete=False)
            assert await flush(v["viewer_token"]) == 404 and await flush(owner) == 200
            # handed again, then the viewer is revoked: control comes back to the owner
            assert (await control(owner, v["viewer_id"])).status_code == 200
            assert await flush(owner) == 404
            assert (await http.delete(f"/v1/sessions/{sid}/viewers/{v['viewer_id']}", headers=auth(owner))
                    ).status_code == 204
            assert await flush(owner) == 200 and await flush(v["viewer_token"]) == 404
            n = (await watcher.next_frame()).frame_index
            assert (await watcher.next_frame()).frame_index > n, "the spectator never noticed"
        finally:
            await watcher.aclose(delete=False)
            await mine.aclose(delete=False)
        await http.delete(f"/v1/sessions/{sid}", headers=auth(owner))


def _on_a_server(model, walk) -> None:  # type: ignore[no-untyped-def]
    serving = _serve(server_config(), model)
    server = next(serving)
    try:
        asyncio.run(walk(server.url))
    finally:
        serving.close()


def test_control_is_handed_over_and_taken_back_one_controller_at_a_time(model) -> None:  # type: ignore[no-untyped-def]
    _on_a_server(model, _walk)


async def _webrtc_walk(url: str) -> None:
    from worldcast.transport.clients.webrtc import WebRTCClient

    c = await WebRTCClient.connect(url, seed=4)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            auth = {"Authorization": f"Bearer {c.token}"}
            await c.wait_event(lambda e: e.get("event") == "frame", timeout_s=20)
            v = (await http.post(f"/v1/sessions/{c.session_id}/viewers", headers=auth)).json()
            closed = asyncio.Event()
            c.control.on("close", closed.set)
            waiting = asyncio.ensure_future(c.wait_event(lambda e: e.get("code") == "control_handed_over",
                                                         timeout_s=20))
            r = await http.post(f"/v1/sessions/{c.session_id}/control", headers=auth, json={"to": v["viewer_id"]})
            assert r.status_code == 200
            ev = await waiting
            assert v["viewer_id"] in ev["message"]
            # the owner's peer closes: its control channel goes with it
            if c.control.readyState != "closed":
                await asyncio.wait_for(closed.wait(), 20)
            assert c.control.readyState == "closed"
    finally:
        await c.aclose()


def test_the_owner_s_webrtc_peer_closes_when_control_is_handed_over(model) -> None:  # type: ignore[no-untyped-def]
    _on_a_server(model, _webrtc_walk)
