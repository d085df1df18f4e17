"""TinyWorld's network: attention rules, and that training and serving compute the same thing."""

import torch

from worldcast.models.base import rectified_flow_update
from worldcast.models.tinyworld.network import (
    DenseAttention,
    FrameAutoencoder,
    TinyWorldConfig,
    TinyWorldDenoiser,
    frame_age_bias,
)
from worldcast.models.tinyworld.rollout import ListKV, _step
from worldcast.models.tinyworld.train import teacher_forcing_bias

CFG = TinyWorldConfig(width=48, heads=4, layers=2, window_frames=2, sink_frames=1)


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
    n, C, h = 5, CFG.latent_channels, CFG.latent_size
    z = torch.randn(1, n, C, h, h)
    act = torch.randn(1, n, CFG.action_dim)
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
    x0_par, _ = net(*seq, DenseAttention(None, teacher_forcing_bias(n, 1, CFG)))
    cache = ListKV(CFG)
    for i in range(n):
        if i > 0:
            x0_inc, _ = _step(net, x_t[:, i - 1], z[:, i - 1], float(t[0, i - 1]), act[:, i], pro[:, i], i, cache)
            torch.testing.assert_close(x0_inc[:, 0], x0_par[:, n + i - 1], atol=2e-4, rtol=1e-3)
        _, kv = _step(net, z[:, i], prev[:, i], 0.0, act[:, i], pro[:, i], i, cache)
        cache.append(i, kv)
    assert len(cache.frames) == CFG.sink_frames + CFG.window_frames


@torch.no_grad()
def test_commit_pass_computes_the_same_keys_and_values_without_the_output() -> None:
    torch.manual_seed(1)
    net = TinyWorldDenoiser(CFG).eval()
    for p in net.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    C, h = CFG.latent_channels, CFG.latent_size
    args = (torch.randn(2, 1, C, h, h), torch.randn(2, 1, C, h, h), torch.zeros(2, 1), torch.randn(2, 1, 8),
            torch.randn(2, 1, CFG.prompt_dim))
    q = torch.zeros(2, CFG.tokens_per_frame, dtype=torch.long)
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=CFG)
    x0, full = net(*args, DenseAttention(None, bias))
    none, kv_only = net(*args, DenseAttention(None, bias), kv_only=True)
    assert x0 is not None and none is None and len(kv_only) == CFG.layers
    for (k1, v1), (k2, v2) in zip(full, kv_only, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_untrained_denoiser_copies_the_previous_frame() -> None:
    net = TinyWorldDenoiser(CFG)
    z = torch.randn(2, 1, CFG.latent_channels, CFG.latent_size, CFG.latent_size)
    q = torch.zeros(2, CFG.tokens_per_frame, dtype=torch.long)
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=CFG)
    x0, kv = net(torch.randn_like(z), z, torch.ones(2, 1), torch.zeros(2, 1, 8), torch.zeros(2, 1, 384),
                 DenseAttention(None, bias))
    torch.testing.assert_close(x0, z)
    assert len(kv) == CFG.layers and kv[0][0].shape == (2, CFG.tokens_per_frame, CFG.heads, CFG.head_dim)


def test_autoencoder_shapes() -> None:
    ae = FrameAutoencoder(CFG)
    z = ae.encode(torch.rand(3, 3, 64, 64))
    assert z.shape == (3, CFG.latent_channels, CFG.latent_size, CFG.latent_size)
    assert ae.decode(z).shape == (3, 3, 64, 64)


def test_rectified_flow_update_endpoints() -> None:
    x0, eps = torch.randn(2, 4), torch.randn(2, 4)
    x1 = eps
    t1, t0 = torch.ones(2), torch.zeros(2)
    torch.testing.assert_close(rectified_flow_update(x1, x0, t1, t0), x0)
    half = rectified_flow_update(x1, x0, t1, torch.full((2,), 0.5))
    torch.testing.assert_close(half, 0.5 * x0 + 0.5 * eps)
