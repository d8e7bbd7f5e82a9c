"""kv/batch_rows.py: a batch of rows through one RowsAttentionCache equals each row alone (its keys, its
mask, plain SDPA with the kv heads repeated), decode (T = 1) and prefill (T > 1) alike."""

import pytest
import torch
import torch.nn.functional as F

from treeflash.kv.batch_rows import RowsCache


@pytest.mark.parametrize("t", [1, 5])
def test_rows_attend_each_to_their_own_keys(t):
    b, hkv, group, d, width = 3, 2, 3, 16, 12
    cache = RowsCache.zeros(b, 2, hkv, width, d, torch.float32, torch.device("cpu"))
    layer = cache.layers[1]
    layer.k.normal_()
    layer.v.normal_()
    cols = torch.arange(4, 4 + t)
    q, k, v = torch.randn(b * t, hkv * group, d), torch.randn(b * t, hkv, d), torch.randn(b * t, hkv, d)
    mask = torch.rand(b, t, width) < 0.7
    mask[:, :, 0] = True
    out = layer.attend_static(q, k, v, cols, mask, 0.25)  # [B * T, H, D]
    for r in range(b):
        keys, values = layer.k[r], layer.v[r]  # [Hkv, L, D], the new rows written
        assert torch.equal(keys[:, cols], k[r * t:(r + 1) * t].transpose(0, 1))
        qr = q[r * t:(r + 1) * t].transpose(0, 1)  # [H, T, D]
        ref = F.scaled_dot_product_attention(qr, keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0),
                                             attn_mask=mask[r][None], scale=0.25)
        torch.testing.assert_close(out[r * t:(r + 1) * t], ref.transpose(0, 1), rtol=1e-5, atol=1e-5)
    assert cache.rows(1, 3).layers[1].k.data_ptr() == layer.k[1].data_ptr()  # a view of rows 1..2
    assert (cache.batch, cache.max_len) == (b, width)


def test_rows_reject_mismatched_shapes():
    cache = RowsCache.zeros(2, 1, 1, 8, 16, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="2 rows x 1 tokens"):
        cache.layers[0].attend_static(torch.randn(3, 2, 16), torch.randn(3, 1, 16), torch.randn(3, 1, 16),
                                      torch.tensor([0]), torch.ones(2, 1, 8, dtype=torch.bool), 0.25)


def test_rows_step_flattens_row_major_and_checks_shapes():
    from treeflash.models.step import StepInput

    ids, pos = torch.arange(6).view(2, 3), torch.tensor([[0, 1, 2], [5, 6, 7]])
    step = StepInput.rows(ids, pos, torch.arange(4, 7), torch.ones(2, 3, 9, dtype=torch.bool))
    assert step.input_ids.tolist() == [0, 1, 2, 3, 4, 5] and step.positions.tolist() == [0, 1, 2, 5, 6, 7]
    with pytest.raises(ValueError, match="key_mask"):
        StepInput.rows(ids, pos, torch.arange(3), torch.ones(2, 9, dtype=torch.bool))


def test_the_grouped_mask_is_built_once_a_step():
    """Every layer of a RowsCache sees one step's key_mask: its grouped [B, 1, G*T, L] form is built once."""
    cache = RowsCache.zeros(2, 3, 1, 8, 16, torch.float32, torch.device("cpu"))
    mask = torch.rand(2, 4, 8) < 0.5
    first = cache.layers[0].masks(mask, 3)
    assert cache.layers[2].masks(mask, 3) is first and first.shape == (2, 1, 12, 8)
    assert torch.equal(first[:, 0].view(2, 3, 4, 8), mask[:, None].expand(2, 3, 4, 8))  # row g * T + t sees token t's keys
    assert cache.layers[1].masks(mask.clone(), 3) is not first  # another step's mask
