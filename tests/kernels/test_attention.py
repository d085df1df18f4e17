import pytest
import torch

from worldcast.kernels.attention import attention, attention_reference


@pytest.mark.parametrize("B,H,Nq,Nk,hd", [(1, 1, 4, 4, 8), (2, 6, 64, 384, 32), (3, 2, 7, 19, 16)])
def test_attention_matches_reference_with_ragged_masks(B: int, H: int, Nq: int, Nk: int, hd: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, hd, generator=g) for n in (Nq, Nk, Nk))
    bias = torch.randn(B, H, Nq, Nk, generator=g)
    lengths = torch.randint(1, Nk + 1, (B,), generator=g)
    bias = bias.masked_fill(torch.arange(Nk)[None, None, None, :] >= lengths[:, None, None, None], float("-inf"))
    torch.testing.assert_close(attention(q, k, v, bias), attention_reference(q, k, v, bias), atol=1e-5, rtol=1e-4)


def test_masked_keys_do_not_contribute() -> None:
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    bias = torch.tensor([0.0, 0.0, float("-inf")]).expand(1, 1, 2, 3)
    v2 = v.clone()
    v2[..., 2, :] = 1e6
    torch.testing.assert_close(attention(q, k, v, bias), attention(q, k, v2, bias))


def test_frame_age_bias_masks_and_penalises_by_frame_age() -> None:
    from worldcast.kernels.frame_attention import FrameAgeBias

    q_frame = torch.full((1, 2), 5)
    k_frame = torch.tensor([[0, 0, 3, 3, 4, 4, 5, 5]])
    k_valid = torch.ones(1, 8, dtype=torch.bool)
    dense = FrameAgeBias(q_frame, k_frame, k_valid, torch.tensor([0.5, 0.0]), window=2, sink_frames=1).dense()
    assert dense.shape == (1, 2, 2, 8)
    # sink frame 0 is beyond the window: allowed, age capped at window + 1 = 3 -> -0.5 * 3
    assert dense[0, 0, 0, 0].item() == pytest.approx(-1.5)
    assert dense[0, 0, 0, 2].item() == pytest.approx(-1.0)  # frame 3, age 2, inside the window
    assert dense[0, 1, 0, 2].item() == 0.0  # zero-slope head
    only_own = torch.zeros_like(k_valid).index_fill_(1, torch.tensor([6, 7]), True)
    masked = FrameAgeBias(q_frame, k_frame, only_own, torch.tensor([0.5, 0.0]), 2, 1).dense()
    assert torch.isinf(masked[0, 0, 0, :6]).all()  # empty slots are masked
    q, k, v = torch.randn(1, 2, 2, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    assert torch.allclose(attention(q, k, v, masked), attention_reference(q, k, v, masked), atol=1e-5)
