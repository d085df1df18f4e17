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
