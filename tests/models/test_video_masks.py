"""VideoEncoder: padded frames reach no valid output (batchnorm included), and bad input is one clear line."""
import pytest
import torch

from normlab import VideoEncoder
from normlab._checks import BadType, BadValue
from normlab.batchnorm import MaskedBatchNorm


@pytest.mark.parametrize("attention", ["divided", "joint"])
@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_padded_frames_move_no_valid_output_or_statistic(attention, placement):
    torch.manual_seed(0)
    enc = VideoEncoder(8, 2, 2, 16, n_patches=3, attention=attention, norm="batchnorm", placement=placement).train()
    x = torch.randn(2, 4, 3, 8)
    mask = torch.tensor([[False] * 4, [False, False, True, True]])  # the last two frames of clip 1: padding
    other = x.clone()
    other[1, 2:] += 100.0  # only the padded frames differ
    state = {k: v.clone() for k, v in enc.state_dict().items()}
    y, after = enc(x, mask), {k: v.clone() for k, v in enc.state_dict().items()}
    enc.load_state_dict(state)
    y2 = enc(other, mask)
    assert torch.equal(y[~mask], y2[~mask])  # the final norm and the space/FFN norms counted the padding before
    for k, v in enc.state_dict().items():
        assert torch.equal(v, after[k]), k  # running statistics too
    assert torch.isfinite(y[~mask]).all()


def test_bad_video_input_is_one_line():
    v = VideoEncoder(8, 2, 1, n_patches=3, attention="joint")
    with pytest.raises(BadValue, match=r"expected input of shape \(B, T, 3, 8\).*got \[2, 4, 8\]"):
        v(torch.randn(2, 4, 8))
    with pytest.raises(BadValue, match=r"got \[2, 4, 3, 7\]"):
        v(torch.randn(2, 4, 3, 7))
    with pytest.raises(BadType, match="floating-point"):
        v(torch.ones(2, 4, 3, 8, dtype=torch.long))
    with pytest.raises(BadValue, match=r"padding mask has shape \[2, 5\]; an input of shape \[2, 4, 3, 8\]"):
        v(torch.randn(2, 4, 3, 8), torch.zeros(2, 5, dtype=torch.bool))


def test_batchnorm_refuses_bad_input_before_its_statistics_move():
    bn = MaskedBatchNorm(6)
    with pytest.raises(BadValue, match="does not match"):
        bn(torch.randn(2, 3, 4) + 5)  # 24 elements: reshape(-1, 6) passed, then the buffers moved
    assert torch.equal(bn.running_mean, torch.zeros(6)) and int(bn.num_batches_tracked) == 0
    with pytest.raises(BadType, match="floating-point"):
        MaskedBatchNorm(4)(torch.arange(24).reshape(2, 3, 4))
    with pytest.raises(BadValue, match="num_features must be a whole number"):
        MaskedBatchNorm(4.0)
