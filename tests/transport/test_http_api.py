"""The HTTP API against a real server on loopback: statuses, auth, precise errors."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import _serve, server_config
from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.sessions.manager import SessionConfig


@pytest.fixture
def client(live_server):  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        yield c


def create(client: httpx.Client, **body) -> dict:  # type: ignore[no-untyped-def, type-arg]
    r = client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "service": "worldcast"}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"


def test_create_get_delete(client: httpx.Client) -> None:
    s = create(client, prompt="a snowy landscape", seed=5)
    assert s["model"]["keys"] == ["w", "a", "s", "d", "space", "shift"] and s["model"]["fps"] > 0
    r = client.get(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))
    assert r.status_code == 200 and r.json()["prompt"] == "a snowy landscape"
    assert client.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"])).status_code == 204
    assert client.get(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"])).status_code == 404


def test_create_without_body_uses_default_prompt(client: httpx.Client) -> None:
    r = client.post("/v1/sessions")
    assert r.status_code == 201
    s = r.json()
    info = client.get(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"])).json()
    assert info["prompt"] == s["model"]["default_prompt"]
    client.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"prompt": "x" * 501}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"seed": -1}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_create_bodies_are_422_with_the_field_named(client: httpx.Client, body, needle) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/v1/sessions", json=body)
    assert r.status_code == 422 and needle in r.json()["detail"]


def test_malformed_json_body_is_422(client: httpx.Client) -> None:
    r = client.post("/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422


def test_auth_missing_wrong_and_unknown(client: httpx.Client) -> None:
    a, b = create(client), create(client)
    url = f"/v1/sessions/{a['session_id']}"
    assert client.get(url).status_code == 401
    assert client.get(url, headers={"Authorization": "Token x"}).status_code == 401
    # another session's token and an unknown id answer alike: nobody learns which ids exist
    wrong = client.get(url, headers=auth(b["token"]))
    unknown = client.get("/v1/sessions/deadbeef", headers=auth(a["token"]))
    assert (wrong.status_code, wrong.json()) == (unknown.status_code, unknown.json()) == (
        404, {"detail": "no such session for this token"})
    assert client.delete(url, headers=auth(b["token"])).status_code == 404
    assert client.get(url, headers=auth(a["token"])).status_code == 200  # untouched
    for s in (a, b):
        client.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))


@pytest.mark.parametrize(
    "body,status,needle",
    [
        ({"sdp": "v=0\r\nthis is not sdp", "type": "offer"}, 400, "invalid SDP"),
        ({"sdp": "v=0", "type": "answer"}, 422, "type"),
        ({"type": "offer"}, 422, "sdp"),
        ({"sdp": "x" * 70_000, "type": "offer"}, 422, "sdp"),
    ],
)
def test_bad_sdp_is_rejected_and_session_survives(client: httpx.Client, body, status, needle) -> None:  # type: ignore[no-untyped-def]
    s = create(client)
    r = client.post(f"/v1/sessions/{s['session_id']}/webrtc", json=body, headers=auth(s["token"]))
    assert r.status_code == status and needle in r.json()["detail"]
    info = client.get(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))
    assert info.status_code == 200 and info.json()["state"] in ("created", "active")
    client.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))


@pytest.mark.parametrize(
    "req,status,code,needle",
    [
        ({"id": 1, "method": "teleport"}, 404, -32601, "unknown method"),
        ({"id": 2, "method": "set_prompt", "params": {}}, 400, -32602, "prompt"),
        ({"id": 3, "method": "set_prompt", "params": {"prompt": "x" * 501}}, 400, -32602, "prompt"),
        ({"id": 4, "method": "flush", "params": {"now": True}}, 400, -32602, "now"),
        ({"id": 5}, 400, -32600, "method"),
    ],
)
def test_bad_rpcs_get_precise_errors(client: httpx.Client, req, status, code, needle) -> None:  # type: ignore[no-untyped-def]
    s = create(client)
    r = client.post(f"/v1/sessions/{s['session_id']}/rpc", json=req, headers=auth(s["token"]))
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == code and needle in err["message"]
    state = client.post(f"/v1/sessions/{s['session_id']}/rpc", json={"id": 9, "method": "get_state"},
                        headers=auth(s["token"])).json()["result"]
    assert state["epoch"] == 0 and state["prompt"] == s["model"]["default_prompt"]  # nothing changed
    client.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))


def test_rpcs_over_http(client: httpx.Client) -> None:
    s = create(client)
    url, h = f"/v1/sessions/{s['session_id']}/rpc", auth(s["token"])
    assert client.post(url, json={"id": 1, "method": "set_prompt", "params": {"prompt": "lava"}}, headers=h).json() \
        == {"id": 1, "result": {"prompt": "lava"}}
    assert client.post(url, json={"id": 2, "method": "flush"}, headers=h).json()["result"] == {"epoch": 1}
    assert client.post(url, json={"id": 3, "method": "pause"}, headers=h).json()["result"] == {}
    st = client.post(url, json={"id": 4, "method": "get_state"}, headers=h).json()["result"]
    assert st["paused"] and st["prompt"] == "lava"
    client.delete(f"/v1/sessions/{s['session_id']}", headers=h)


def test_http_rpcs_share_the_control_budget_and_429_names_the_request(client: httpx.Client) -> None:
    a, b = create(client), create(client)
    url, h = f"/v1/sessions/{a['session_id']}/rpc", auth(a["token"])
    t0, ok, refused = time.monotonic(), 0, None
    for i in range(200):  # bounded: the budget is 10/s with bursts of 20
        r = client.post(url, json={"jsonrpc": "2.0", "id": i, "method": "get_state"}, headers=h)
        if r.status_code == 429:
            refused = (i, r)
            break
        assert r.status_code == 200, r.text
        ok += 1
    assert refused is not None, "200 requests in a row were all served"
    i, r = refused
    assert ok <= 20 + 10 * (time.monotonic() - t0) + 1
    assert r.headers["Retry-After"] == "1"
    assert r.json() == {"jsonrpc": "2.0", "id": i, "error": {"code": -32001, "message": r.json()["error"]["message"]}}
    assert "10 control requests per second" in r.json()["error"]["message"]
    # another session's budget is its own
    other = client.post(f"/v1/sessions/{b['session_id']}/rpc", json={"id": 1, "method": "get_state"},
                        headers=auth(b["token"]))
    assert other.status_code == 200
    for s in (a, b):
        client.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))


def test_a_directing_session_refuses_set_prompt_and_an_early_resume(client: httpx.Client) -> None:
    s = create(client, mode="directing")
    url, h = f"/v1/sessions/{s['session_id']}/rpc", auth(s["token"])
    r = client.post(url, json={"id": 1, "method": "set_prompt", "params": {"prompt": "lava"}}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32600 and "direction" in r.json()["error"]["message"]
    r = client.post(url, json={"id": 2, "method": "resume"}, headers=h)
    assert r.status_code == 400 and "first direction" in r.json()["error"]["message"]
    st = client.post(url, json={"id": 3, "method": "get_state"}, headers=h).json()["result"]
    assert st["prompt"] == s["model"]["default_prompt"] and st["paused"]  # nothing changed
    client.delete(f"/v1/sessions/{s['session_id']}", headers=h)


def test_capacity_is_refused_with_503_and_retry_after(model) -> None:  # type: ignore[no-untyped-def]
    cfg = SessionConfig(admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=2))
    for srv in _serve(server_config(sessions=cfg), model):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            create(c), create(c)
            r = c.post("/v1/sessions", json={})
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert "limit" in r.json()["detail"]


def test_demo_page_or_build_hint_is_served(client: httpx.Client) -> None:
    r = client.get("/")
    assert r.status_code == 200 and "worldcast" in r.text.lower()


def test_metrics_in_prometheus_text_format(client: httpx.Client, live_server) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client.parser import text_string_to_metric_families

    s = create(client)
    client.post(f"/v1/sessions/{s['session_id']}/rpc", json={"id": 1, "method": "resume"}, headers=auth(s["token"]))
    deadline = time.monotonic() + 20
    while live_server.manager.sessions[s["session_id"]].frames.delivered < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("worldcast_step_seconds", "worldcast_step_batch_size", "worldcast_frame_lateness_seconds",
                 "worldcast_kv_pool_bytes", "worldcast_scheduler_queue_depth", "worldcast_admission_decisions",
                 "worldcast_sessions", "worldcast_device_precision", "worldcast_warmup_seconds"):
        assert name in fams, name
    # no session id on the API port, in any series (per-session series live on --metrics-port only)
    assert s["session_id"] not in r.text and "worldcast_session_frames" not in fams
    assert "worldcast_session_early_starts" not in fams
    served = fams["worldcast_device_precision"].samples
    assert [(x.labels["dtype"], x.value) for x in served] == [("float32", 1.0)]  # the suite fixes float32
    assert {x.labels["phase"] for x in fams["worldcast_warmup_seconds"].samples} >= {"precision", "total"}
    kv = {smp.labels["kind"]: smp.value for smp in fams["worldcast_kv_pool_bytes"].samples}
    assert 0 < kv["used"] <= kv["budget"]
    steps = [smp for smp in fams["worldcast_step_seconds"].samples if smp.name.endswith("_count")]
    assert sum(smp.value for smp in steps) > 0
    client.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))


def test_readyz_reports_a_dead_device_worker(model) -> None:  # type: ignore[no-untyped-def]
    for srv in _serve(server_config(), model):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.get("/readyz").status_code == 200
            srv.manager.engines[0].worker.stop()
            r = c.get("/readyz")
            assert r.status_code == 503 and r.json()["status"] == "not ready"
            assert c.get("/healthz").status_code == 200


def test_a_device_too_slow_for_one_session_is_degraded_and_says_so() -> None:
    """A named fake of a slow device: TinyWorld whose every denoising step also waits a whole chunk
    period, so warm-up measures a chunk far over its period (a busier machine only makes it slower)."""
    from worldcast.engine.device_worker import EngineConfig
    from worldcast.models.tinyworld import TinyWorldModel

    class SlowDeviceTinyWorld(TinyWorldModel):
        def denoise(self, x_t, t, cond, state):  # type: ignore[no-untyped-def]
            time.sleep(float(self.spec.chunk_period))
            return super().denoise(x_t, t, cond, state)

    slow = SlowDeviceTinyWorld.from_pretrained()
    cfg = server_config(engine=EngineConfig(state_budget_bytes=64 * 2**20, max_batch=1, torch_threads=1),
                        sessions=SessionConfig(idle_after_s=60.0, timeout_s=120.0,
                                               admission=AdmissionConfig(policy=AdmissionPolicy.DUTY_CYCLE)))
    for srv in _serve(cfg, slow):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.get("/readyz")
            assert r.status_code == 200 and r.json()["degraded"] is True and "below real time" in r.json()["reason"]
            assert "worldcast_device_degraded 1.0" in c.get("/metrics").text
            first = create(c)  # an idle device serves one session, however slowly
            r = c.post("/v1/sessions", json={})
            assert r.status_code == 503 and "Retry-After" in r.headers
            assert "degraded" in r.json()["detail"]
            c.delete(f"/v1/sessions/{first['session_id']}", headers=auth(first["token"]))


@pytest.mark.parametrize(
    "content,headers,status",
    [
        (b'{"seed": 1}', {"Content-Type": "text/plain"}, 415),
        (b"seed=1", {"Content-Type": "application/x-www-form-urlencoded"}, 415),
        (b'{"seed": NaN}', {"Content-Type": "application/json"}, 422),
        (b'{"prompt": "\\ud800"}', {"Content-Type": "application/json"}, 422),
        (b'{"prompt": "  "}', {"Content-Type": "application/json"}, 422),
        (b'{"prompt": "a\\u202eb"}', {"Content-Type": "application/json"}, 422),
        (b'{"prompt": "' + b"x" * 300_000 + b'"}', {"Content-Type": "application/json"}, 413),
    ],
)
def test_hostile_bodies_get_4xx_without_echo(client: httpx.Client, content, headers, status) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/v1/sessions", content=content, headers=headers)
    assert r.status_code == status, r.text[:300]
    assert len(r.content) < 4096  # the input is never echoed back


def test_auth_scheme_is_case_insensitive_and_empty_token_is_401(client: httpx.Client) -> None:
    s = create(client)
    url = f"/v1/sessions/{s['session_id']}"
    assert client.get(url, headers={"Authorization": "bearer " + s["token"]}).status_code == 200
    assert client.get(url, headers={"Authorization": "Bearer"}).status_code == 401
    client.delete(url, headers=auth(s["token"]))


def test_a_chunked_body_over_the_limit_is_refused_while_reading(client: httpx.Client) -> None:
    def chunks():  # type: ignore[no-untyped-def]  # no Content-Length: chunked transfer coding
        yield b'{"prompt": "'
        for _ in range(128):  # 8 MiB, far over the 256 KiB limit
            yield b"x" * 65536
        yield b'"}'

    r = client.post("/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "over 262144 bytes" in r.json()["detail"]
    small = client.post("/v1/sessions", content=iter([b'{"seed": ', b"3}"]),
                        headers={"Content-Type": "application/json"})
    assert small.status_code == 201, small.text  # a small chunked body still works
    client.delete(f"/v1/sessions/{small.json()['session_id']}", headers=auth(small.json()["token"]))
