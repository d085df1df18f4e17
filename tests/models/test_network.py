"""TinyWorld's network: attention rules, the camera warp, the palette, and that training and serving compute
the same thing."""

import numpy as np
import torch

from worldcast.models.base import rectified_flow_update
from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.network import (
    HEAD_PLANES,
    HEIGHT,
    OBJECT,
    PALETTE,
    WORLD_COLOURS,
    DenseAttention,
    TinyWorldConfig,
    TinyWorldDenoiser,
    camera_shift,
    carry_noise,
    draw_objects,
    draw_terrain,
    frame_age_bias,
    gaussian_blur,
    marker_mask,
    noise_canvas_side,
    noise_field,
    paint,
    smooth_height,
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


def test_the_painter_draws_as_the_simulator_does() -> None:
    """`paint` is `world.render_view`'s equation: terrain between the low and high colours by height, the object
    colour by coverage; the overlay colours only on the marker."""
    torch.manual_seed(2)
    net = TinyWorldDenoiser(CFG)
    colours = net.colours(torch.randn(2, CFG.prompt_dim))
    assert colours.shape == (2, PALETTE, 3)
    head = torch.randn(2, HEAD_PLANES, S, S) * 3
    head[:, 2] = 30.0  # the world layer everywhere it may be
    outside = ~marker_mask(S)
    h = torch.sigmoid(head[:, HEIGHT:HEIGHT + 1])
    lo, hi, ob = (colours[:, i, :, None, None] for i in range(3))
    # expected picture: the object's probability mixes the object colour over the terrain
    o = torch.sigmoid(head[:, OBJECT:OBJECT + 1])
    want = (lo + h * (hi - lo)) * (1 - o) + ob * o
    out = paint(head, colours, net.overlay_bias)
    torch.testing.assert_close(out[:, :, outside], want[:, :, outside])
    # a drawn coverage paints exact object colour where 1, exact terrain where 0
    drawn = (torch.rand(2, 1, S, S) < 0.3).float()
    out = paint(head, colours, net.overlay_bias, drawn)
    on = (drawn[:, 0].bool() & outside)
    torch.testing.assert_close(out.permute(0, 2, 3, 1)[on], ob[:, :, 0, 0][:, None].expand(-1, S * S, -1)
                               .reshape(2, S, S, 3)[on])
    off = (~drawn[:, 0].bool() & outside)
    torch.testing.assert_close(out.permute(0, 2, 3, 1)[off], (lo + h * (hi - lo)).permute(0, 2, 3, 1)[off])
    # layer logits that pick the first overlay colour paint it on the marker and nowhere else
    pick = head.clone()
    pick[:, 2:] = -20.0
    pick[:, 3] = 20.0
    hud = paint(pick, colours, net.overlay_bias)
    torch.testing.assert_close(hud[:, :, ~outside], colours[:, WORLD_COLOURS, :, None].expand(-1, -1,
                                                                                          int((~outside).sum())))
    assert not torch.isclose(hud[:, :, outside], colours[:, WORLD_COLOURS, :, None]).all()


def test_drawn_objects_keep_their_probability_and_come_in_blobs() -> None:
    """Over many draws each pixel is object about as often as its probability says (the copula keeps the
    marginals), and neighbours agree far more often than independent draws would; only edges are partial."""
    g = torch.Generator().manual_seed(0)
    p = torch.full((1, 1, S, S), 0.05)
    p[..., :, : S // 2] = 0.5
    logit = torch.logit(p).expand(256, -1, -1, -1)
    C = noise_canvas_side(S)
    z = noise_field(torch.randn(256, 1, C, C, generator=g), 6.0, S)
    assert abs(float(z.std()) - 1) < 0.05, "the field is standard normal per pixel"
    d = draw_objects(logit, z, 6.0)
    assert float(d.min()) >= 0 and float(d.max()) <= 1
    assert float(((d > 0) & (d < 1)).float().mean()) < 0.25  # anti-aliased edges only (many at p = 0.5)
    rate = d.mean(0)[0]
    assert abs(float(rate[:, : S // 2 - 6].mean()) - 0.5) < 0.02
    assert abs(float(rate[:, S // 2 + 6:].mean()) - 0.05) < 0.01
    # neighbours on the sparse half: P(both object) far above independence's 0.05 ** 2
    right = d[..., S // 2 + 6:]
    both = float((right[..., :, 1:] * right[..., :, :-1]).mean())
    assert both > 5 * 0.05 ** 2
    # deterministic in the noise: the same noise draws the same objects
    assert torch.equal(draw_objects(logit, z, 6.0), d)


def test_smoothing_the_height_keeps_the_simulators_terrain_and_removes_pixel_grain() -> None:
    """The served height smoothing leaves a simulator view's height (value noise on 16- and 32-pixel cells) all but
    unchanged, while a pixel-scale grain on it (the one-pass painter's) loses most of its mean |Laplacian|; the
    result stays a height in [0, 1], and the view's edge is not wrapped around."""
    views = torch.stack([torch.from_numpy(world._view(world.WorldMap.generate(seed).height, 37 * seed, 11, 64))
                         for seed in range(4)])[:, None].clamp(1e-3, 1 - 1e-3)

    def lap(h: torch.Tensor) -> float:
        return float((h[..., :-2, 1:-1] + h[..., 2:, 1:-1] + h[..., 1:-1, :-2] + h[..., 1:-1, 2:]
                      - 4 * h[..., 1:-1, 1:-1]).abs().mean())

    smooth = smooth_height(torch.logit(views))
    assert smooth.dtype == torch.float32 and smooth.shape == views.shape
    assert float((smooth - views).abs().max()) < 0.05 and float((smooth - views).abs().mean()) < 0.01
    g = torch.Generator().manual_seed(1)
    grain = (views + 0.05 * torch.randn(views.shape, generator=g)).clamp(1e-3, 1 - 1e-3)
    out = smooth_height(torch.logit(grain).to(torch.bfloat16))
    assert lap(out) < lap(grain) / 8
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    edge = torch.zeros(1, 1, S, S)
    edge[..., :, : S // 2] = 1.0  # a cliff at the middle column and, on a torus, at the border
    h = smooth_height(torch.logit(edge.clamp(1e-3, 1 - 1e-3)))
    assert float(h[..., :, 0].min()) > 0.99 and float(h[..., :, -1].max()) < 0.01  # the border: no wrap
    assert 0.3 < float(h[0, 0, 5, S // 2 - 1]) < 0.7  # the cliff: blurred


def test_draw_fields_are_anchored_to_the_world_so_each_strip_continues_the_last() -> None:
    """Over a walk of random moves (keys, shift, mouse pans, diagonals), the field a draw reads at a world
    position does not change from one frame to the next while that position is in view: a strip revealed
    now is drawn from the same field as the neighbour drawn a frame ago (the view-only field this replaced
    wrapped at the edge, and drawn objects came out as combs). The two planes are independent fields."""
    g = torch.Generator().manual_seed(5)
    rng = np.random.default_rng(5)
    C = noise_canvas_side(S)
    canvas = torch.zeros(1, 2, C, C)
    acts = world.random_actions(rng, 60)
    seen: dict[tuple[int, int], tuple[float, float]] = {}  # world (y, x) -> (object field, terrain field)
    values = []
    x = y = 0
    checked = 0
    for a in acts:
        a_t = torch.from_numpy(a)[None]
        canvas = carry_noise(canvas, torch.randn(1, 3 * S * S, generator=g), a_t)
        dx, dy = world.camera_step(a)
        x, y = x + dx, y + dy
        zo, zt = noise_field(canvas[:, :1], 6.0, S)[0, 0], noise_field(canvas[:, 1:], 7.0, S)[0, 0]
        now = {(y + r, x + c): (float(zo[r, c]), float(zt[r, c]))
               for r in range(S) for c in range(S) if (y + r) % 3 == 0 and (x + c) % 3 == 0}
        for key, v in now.items():  # in view last frame and this one (a position out of view is forgotten)
            if key in seen:
                assert seen[key] == v, f"the field moved at world {key}"
                checked += 1
        seen = now
        values += list(now.values())
    assert checked > 10_000
    zs = np.array(values)
    assert abs(np.corrcoef(zs.T)[0, 1]) < 0.2, "the object and terrain fields are independent"


def test_drawn_terrain_follows_the_field_along_a_walk_instead_of_extruding_the_edge() -> None:
    """A painter that only continues the known edge (the expected continuation, as a mean-trained painter
    does) extrudes it into bands; with `draw_terrain` the heights along a walk follow the world-anchored
    field's increments exactly from where the walk began, h = h0 + scale (z - z0): they telescope, never
    drift. Pixels the warp shows are untouched."""
    g = torch.Generator().manual_seed(6)
    C = noise_canvas_side(S)
    canvas = torch.zeros(1, 2, C, C)
    right = torch.from_numpy(world.action_vector({"d": True}))[None]
    height = torch.full((1, 1, S, S), 0.5)
    scale = 0.05  # small enough that nothing clamps
    z0 = None
    for _ in range(40):  # 80 px to the right: everything in view was painted on the walk
        canvas = carry_noise(canvas, torch.randn(1, 3 * S * S, generator=g), right)
        dx, dy = camera_shift(right)
        z = noise_field(canvas[:, 1:], 7.0, S)
        z0 = z[..., :, : S - 2] if z0 is None else z0
        src = height[..., :, 2:]  # the warp: known pixels move two columns left
        continued = torch.cat([src, src[..., :, -1:].expand(-1, -1, -1, 2)], dim=-1)  # the edge extruded
        drawn = draw_terrain(continued, z, dx, dy, scale)
        assert torch.equal(drawn[..., :, : S - 2], continued[..., :, : S - 2]), "known pixels are untouched"
        height = drawn
    # a row's heights follow the field along the walk: h(x) - h(x') = scale (z(x) - z(x'))
    dz = z[0, 0] - z[0, 0, :, :1]
    dh = height[0, 0] - height[0, 0, :, :1]
    torch.testing.assert_close(dh, scale * dz, atol=1e-5, rtol=0)
    assert float(height.std(dim=-1).mean()) > 0.5 * scale, "the walk shows variation along the motion"


def test_a_compiled_blur_builds_its_kernel_without_tracing_the_eager_cache() -> None:
    """Compiled, the blur's kernel is built in the graph (Dynamo warns when it traces a functools.lru_cache, as
    the warm-up's log showed); the compiled blur equals the eager one."""
    import warnings

    x = torch.randn(1, 1, 64, 64, generator=torch.Generator().manual_seed(0))
    fn = torch.compile(lambda t: gaussian_blur(t, 6.0, unit_l2=True), backend="eager",
                       fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fn(x)
    assert not [w for w in caught if "lru_cache" in str(w.message)]
    assert torch.allclose(y, gaussian_blur(x, 6.0, unit_l2=True))


def test_a_new_network_learns_to_mix_colours() -> None:
    """No symmetric start: the world colours differ, and the height and object logits get a gradient from the
    first step (with equal colours they would get none)."""
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
        x0, _, logit, _ = net.predict(torch.randn(1, 1, 3, S, S), *args[:1], torch.full((1, 1), t), *args[2:],
                                   cut=torch.zeros(1, 1, dtype=torch.bool))
        assert torch.equal(x0[0, 0][:, k], fr[1][:, k])
        outs.append(x0)
    assert not torch.equal(outs[0][0, 0][:, ~k], outs[1][0, 0][:, ~k])  # the strip is imagined anew
    assert logit.shape == (1, 1)
    cut, _, _, _ = net.predict(torch.randn(1, 1, 3, S, S), *args, cut=torch.ones(1, 1, dtype=torch.bool))
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


def test_serving_draws_each_strip_pixel_as_terrain_or_object_and_follows_the_noise() -> None:
    """With `draw` on (serving), a pass at flow time 1 paints imagined pixels exactly the object colour or a terrain
    colour between low and high (mixes only on an object's anti-aliased edge); the draw follows the noise (the
    same noise, the same picture; other noise, other objects), and passes at t < 1 paint the expected picture."""
    torch.manual_seed(4)
    net = TinyWorldDenoiser(CFG)
    for p in net.parameters():
        p.data.add_(torch.randn_like(p) * 0.05)
    with torch.no_grad():
        net.head.conv_out.bias[OBJECT] = 0.0  # objects likely: both kinds of pixel in one strip
    net.draw = True
    acts = np.stack([world.action_vector({"d": True, "shift": True})])
    fr = _frames("night", acts)
    q = torch.zeros(1, CFG.tokens_per_frame, dtype=torch.long)
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=CFG)
    prompt = torch.randn(1, 1, CFG.prompt_dim)
    args = (fr[None, :1], torch.ones(1, 1), torch.from_numpy(acts)[None], prompt, DenseAttention(None, bias))
    _, known = warp(fr[:1], *camera_shift(torch.from_numpy(acts)), marker_mask(S))
    imagined = ~known[0, 0].bool() & ~marker_mask(S)
    lo, hi, ob = net.colours(prompt[0])[0, :3].detach()
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(1, 1, 3, S, S, generator=g)
    with torch.no_grad():
        x0, _, _, _ = net.predict(noise, *args, cut=torch.zeros(1, 1, dtype=torch.bool))
        again, _, _, _ = net.predict(noise.clone(), *args, cut=torch.zeros(1, 1, dtype=torch.bool))
        other, _, _, _ = net.predict(torch.randn(1, 1, 3, S, S, generator=g), *args,
                                     cut=torch.zeros(1, 1, dtype=torch.bool))
        mean, _, _, _ = net.predict(noise, fr[None, :1], torch.full((1, 1), 0.5), *args[2:],
                                    cut=torch.zeros(1, 1, dtype=torch.bool))
    px = x0[0, 0][:, imagined].T  # (n, 3)
    is_object = (px - ob).abs().amax(1) < 1e-5
    along = ((px - lo) @ (hi - lo)) / (hi - lo).square().sum()
    on_terrain = (px - (lo + along[:, None].clamp(0, 1) * (hi - lo))).abs().amax(1) < 1e-4
    assert float((is_object | on_terrain).float().mean()) > 0.7
    assert 0 < int(is_object.sum()) < len(px)
    assert torch.equal(x0, again)
    assert not torch.equal(x0[0, 0][:, imagined], other[0, 0][:, imagined])
    assert torch.equal(x0[0, 0][:, known[0, 0].bool()], fr[1][:, known[0, 0].bool()])  # smoothing paints, never moves
    mpx = mean[0, 0][:, imagined].T
    assert not bool(((mpx - ob).abs().amax(1) < 1e-5).any())  # t < 1: the expected picture, objects mixed in


def test_weights_of_another_painter_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Weights whose config lacks the painter (the first TinyWorld 2 weights mixed a 5-colour palette: their tensors
    have the same shapes) or names another one are refused with the reason, not loaded into the wrong meaning."""
    import json

    import pytest
    from safetensors.torch import load_file, save_file

    from worldcast.models.tinyworld.model import TinyWorldModel, save_weights

    net = TinyWorldDenoiser(CFG)
    good = tmp_path / "good.safetensors"
    save_weights(good, CFG, net, torch.zeros(len(world.THEMES), CFG.prompt_dim))
    assert TinyWorldModel.from_pretrained(good).cfg == CFG  # loads
    tensors = load_file(str(good))
    for name, meta in (("none", {k: v for k, v in CFG.__dict__.items() if k != "painter"}),
                       ("other", CFG.__dict__ | {"painter": "palette"})):
        bad = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(bad), metadata={"config": json.dumps(meta)})
        with pytest.raises(ValueError, match="trained for another network"):
            TinyWorldModel.from_pretrained(bad)
