"""TinyWorld's network: attention rules, the camera warp, the palette, and that training and serving compute
the same thing."""

import numpy as np
import torch

from worldcast.models.base import rectified_flow_update
from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.network import (
    PALETTE,
    WORLD_COLOURS,
    DenseAttention,
    TinyWorldConfig,
    TinyWorldDenoiser,
    camera_shift,
    frame_age_bias,
    marker_mask,
    paint,
    to_frame_space,
    warp,
)
from worldcast.models.tinyworld.rollout import ListKV, _step
from worldcast.models.tinyworld.train import teacher_forcing_bias

CFG = TinyWorldConfig(width=48, heads=4, layers=2, window_frames=2, sink_frames=1)
S = CFG.frame_size


def _allowed(bias: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(bias[0, 0])


def test_bias_sees_self_window_and_sink_only() -> None:
    q = torch.tensor([[5]])
    k = torch.tensor([[0, 1, 2, 3, 4, 5, 6]])
    allowed = _allowed(frame_age_bias(q, k, torch.ones_like(k, dtype=torch.bool), cfg=CFG))[0]
    # sink 0, window {3, 4}, itself 5; never 1, 2 (evicted) or 6 (future)
    assert allowed.tolist() == [True, False, False, True, True, True, False]


def test_bias_masks_empty_slots_and_penalises_age() -> None:
    q = torch.tensor([[4]])
    k = torch.tensor([[3, 4, 2]])
    b = frame_age_bias(q, k, torch.tensor([[True, True, False]]), cfg=CFG)
    assert torch.isinf(b[0, :, 0, 2]).all()
    assert (b[0, 0, 0, 0] < b[0, 0, 0, 1]).item()  # older is penalised on sloped heads


def test_bias_positions_never_run_out() -> None:
    q = torch.tensor([[10**12 + 5]])
    k = torch.tensor([[0, 10**12 + 4, 10**12 + 5]])
    b = frame_age_bias(q, k, torch.ones_like(k, dtype=torch.bool), cfg=CFG)
    assert torch.isfinite(b).all()


def test_teacher_forcing_bias_hides_the_target() -> None:
    n, T = 3, CFG.tokens_per_frame
    allowed = _allowed(teacher_forcing_bias(n, 1, CFG))
    clean = lambda i: i * T  # noqa: E731
    noisy = lambda i: (n + i - 1) * T  # noqa: E731
    assert not allowed[noisy(1), clean(1)]  # a noisy frame never sees its own clean frame
    assert allowed[noisy(1), clean(0)] and allowed[noisy(1), noisy(1)]
    assert not allowed[clean(2), noisy(1)] and not allowed[noisy(2), noisy(1)]
    assert not allowed[clean(0), clean(1)]  # causal


@torch.no_grad()
def test_parallel_training_forward_equals_cached_inference() -> None:
    """The teacher-forced sequence forward and the KV-cached step-by-step path agree."""
    torch.manual_seed(0)
    net = TinyWorldDenoiser(CFG).eval()
    for p in net.parameters():  # zero-init layers would make this trivial
        p.add_(torch.randn_like(p) * 0.05)
    n, C, h = 5, CFG.channels, S
    z = torch.randn(1, n, C, h, h)
    act = torch.from_numpy(world.random_actions(np.random.default_rng(0), n))[None]
    pro = torch.randn(1, n, CFG.prompt_dim)
    t = torch.rand(1, n - 1)
    x_t = torch.randn(1, n - 1, C, h, h)
    prev = torch.cat([z[:, :1], z[:, :-1]], 1)
    seq = (
        torch.cat([z, x_t], 1),
        torch.cat([prev, z[:, :-1]], 1),
        torch.cat([torch.zeros(1, n), t], 1),
        torch.cat([act, act[:, 1:]], 1),
        torch.cat([pro, pro[:, 1:]], 1),
    )
    x0_par, _ = net(*seq, DenseAttention(None, teacher_forcing_bias(n, 1, CFG)), predict_from=n)
    assert x0_par.shape == (1, n - 1, C, h, h)  # only the noisy frames are predicted
    cache = ListKV(CFG)
    for i in range(n):
        if i > 0:
            x0_inc, _ = _step(net, x_t[:, i - 1], z[:, i - 1], float(t[0, i - 1]), act[:, i], pro[:, i], i, cache)
            torch.testing.assert_close(x0_inc[:, 0], x0_par[:, i - 1], atol=2e-4, rtol=1e-3)
        _, kv = _step(net, z[:, i], prev[:, i], 0.0, act[:, i], pro[:, i], i, cache)
        cache.append(i, kv)
    assert len(cache.frames) == CFG.sink_frames + CFG.window_frames


@torch.no_grad()
def test_commit_pass_computes_the_same_keys_and_values_without_the_output() -> None:
    torch.manual_seed(1)
    net = TinyWorldDenoiser(CFG).eval()
    for p in net.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    C, h = CFG.channels, S
    args = (torch.randn(2, 1, C, h, h), torch.randn(2, 1, C, h, h), torch.zeros(2, 1), torch.zeros(2, 1, 8),
            torch.randn(2, 1, CFG.prompt_dim))
    q = torch.zeros(2, CFG.tokens_per_frame, dtype=torch.long)
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=CFG)
    x0, full = net(*args, DenseAttention(None, bias))
    none, kv_only = net(*args, DenseAttention(None, bias), kv_only=True)
    assert x0 is not None and none is None and len(kv_only) == CFG.layers
    for (k1, v1), (k2, v2) in zip(full, kv_only, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def _frames(theme: str, actions: np.ndarray, seed: int = 5) -> torch.Tensor:
    """Simulator frames after each action, frame space (len(actions) + 1, 3, S, S)."""
    st = world.WorldState(world.WorldMap.generate(seed), theme, 40, 70)
    out = [world.render_view(st.world, theme, st.x, st.y)]
    out += [world.step(st, a) for a in actions]
    return to_frame_space(torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float() / 255)


def test_camera_shift_is_the_simulators_camera_step() -> None:
    acts = world.random_actions(np.random.default_rng(3), 400)
    acts[::7, 6:8] = np.random.default_rng(4).uniform(-1, 1, (len(acts[::7]), 2))  # off-grid pans too
    dx, dy = camera_shift(torch.from_numpy(acts))
    assert [(int(a), int(b)) for a, b in zip(dx, dy)] == [world.camera_step(a) for a in acts]


def test_the_warp_shows_the_next_view_wherever_the_previous_one_saw_it() -> None:
    """Warping frame k by action k+1 gives the simulator's frame k+1 exactly at every known pixel; unknown
    pixels are the revealed strip (as wide as the move) and the old marker's."""
    acts = np.stack([world.action_vector(k, m) for k, m in [({"d": True}, (0, 0)), ({"w": True, "shift": True},
                    (0, 0)), ({}, (-16, 8)), ({"a": True, "s": True}, (0, 0)), ({}, (0, 0))]])
    fr = _frames("snow", acts)
    dx, dy = camera_shift(torch.from_numpy(acts))
    warped, known = warp(fr[:-1], dx, dy, marker_mask(S))
    marker = marker_mask(S)
    for i in range(len(acts)):
        k = known[i, 0].bool()
        target = fr[i + 1]
        assert torch.equal(warped[i][:, k & ~marker], target[:, k & ~marker])
        assert (warped[i][:, ~k] == 0).all()
        strip = S * abs(int(dx[i])) + S * abs(int(dy[i])) - abs(int(dx[i]) * int(dy[i]))
        assert int((~k).sum()) <= strip + 2 * int(marker.sum())
        assert int((~k).sum()) >= strip + int(marker.sum()) if (dx[i], dy[i]) != (0, 0) else True
        assert not (k & marker).any()  # the marker is an overlay: never kept
    assert known[-1].bool().sum() == S * S - marker.sum()  # still: everything but the marker is known


def test_painted_pixels_stay_inside_the_worlds_palette() -> None:
    torch.manual_seed(2)
    net = TinyWorldDenoiser(CFG)
    colours = net.colours(torch.randn(2, CFG.prompt_dim))
    assert colours.shape == (2, PALETTE, 3)
    logits = torch.randn(2, PALETTE, S, S) * 3
    out = paint(logits, colours, net.overlay_bias)
    outside = ~marker_mask(S)
    # outside the marker every pixel is a convex mix of the three world colours: with all three equal, exactly it
    same = colours.clone()
    same[:, :WORLD_COLOURS] = colours[:, :1]
    flat = paint(logits, same, net.overlay_bias)
    torch.testing.assert_close(flat[:, :, outside], same[:, 0, :, None].expand(-1, -1, int(outside.sum())))
    # logits that pick the first overlay colour paint it on the marker and nowhere else
    pick = torch.full((2, PALETTE, S, S), -20.0)
    pick[:, WORLD_COLOURS] = 20.0
    hud = paint(pick, colours, net.overlay_bias)
    torch.testing.assert_close(hud[:, :, ~outside], colours[:, WORLD_COLOURS, :, None].expand(-1, -1,
                                                                                          int((~outside).sum())))
    assert not torch.isclose(hud[:, :, outside], colours[:, WORLD_COLOURS, :, None]).all()
    assert out.shape == (2, 3, S, S)


def test_a_new_network_learns_to_mix_colours() -> None:
    """No symmetric start: the world colours differ, and the mixing logits get a gradient from the first
    step (with equal colours every painted pixel would stay the world's mean forever)."""
    torch.manual_seed(0)
    net = TinyWorldDenoiser(CFG)
    c = net.colours(torch.randn(1, CFG.prompt_dim))[0, :WORLD_COLOURS]
    assert torch.cdist(c, c).add(torch.eye(WORLD_COLOURS) * 9).min() > 0.5
    z = torch.rand(1, 2, 3, S, S) * 2 - 1
    q = torch.zeros(1, 2 * CFG.tokens_per_frame, dtype=torch.long)
    q[:, CFG.tokens_per_frame:] = 1
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=CFG)
    x0, _ = net(torch.randn_like(z), z, torch.ones(1, 2), torch.zeros(1, 2, 8), torch.randn(1, 2, CFG.prompt_dim),
                DenseAttention(None, bias))
    (x0 - torch.rand_like(x0)).pow(2).mean().backward()
    assert net.head.conv_out.weight.grad.abs().sum() > 0
    assert net.palette.world[2].weight.grad.abs().sum() > 0


def test_known_pixels_are_copied_exactly_and_a_cut_repaints_them() -> None:
    """Where the warp shows a pixel the prediction is that pixel, bit for bit, whatever the noise and flow time;
    a frame treated as a cut is painted everywhere from the palette."""
    torch.manual_seed(4)
    net = TinyWorldDenoiser(CFG)
    for p in net.parameters():
        p.data.add_(torch.randn_like(p) * 0.05)
    acts = np.stack([world.action_vector({"d": True, "shift": True})])
    fr = _frames("desert", acts)
    q = torch.zeros(1, CFG.tokens_per_frame, dtype=torch.long)
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=CFG)
    args = (fr[None, :1], torch.ones(1, 1), torch.from_numpy(acts)[None], torch.randn(1, 1, CFG.prompt_dim),
            DenseAttention(None, bias))
    warped, known = warp(fr[:1], *camera_shift(torch.from_numpy(acts)), marker_mask(S))
    k = known[0, 0].bool()
    outs = []
    for t in (1.0, 0.3):
        x0, _, logit = net.predict(torch.randn(1, 1, 3, S, S), *args[:1], torch.full((1, 1), t), *args[2:],
                                   cut=torch.zeros(1, 1, dtype=torch.bool))
        assert torch.equal(x0[0, 0][:, k], fr[1][:, k])
        outs.append(x0)
    assert not torch.equal(outs[0][0, 0][:, ~k], outs[1][0, 0][:, ~k])  # the strip is imagined anew
    assert logit.shape == (1, 1)
    cut, _, _ = net.predict(torch.randn(1, 1, 3, S, S), *args, cut=torch.ones(1, 1, dtype=torch.bool))
    assert not torch.equal(cut[0, 0][:, k], fr[1][:, k])
    x0, kv = net(torch.randn(1, 1, 3, S, S), *args)  # serving: the classifier decides (a new one: no cut)
    assert torch.equal(x0[0, 0][:, k], fr[1][:, k])
    assert len(kv) == CFG.layers and kv[0][0].shape == (1, CFG.tokens_per_frame, CFG.heads, CFG.head_dim)


def test_rectified_flow_update_endpoints() -> None:
    x0, eps = torch.randn(2, 4), torch.randn(2, 4)
    x1 = eps
    t1, t0 = torch.ones(2), torch.zeros(2)
    torch.testing.assert_close(rectified_flow_update(x1, x0, t1, t0), x0)
    half = rectified_flow_update(x1, x0, t1, torch.full((2,), 0.5))
    torch.testing.assert_close(half, 0.5 * x0 + 0.5 * eps)
