"""Each block's branches get the dropout it was built with; empty sequences, sizes and BERT's inputs are checked."""
import pytest
import torch
from torch.func import jvp

import normlab
from normlab.models.bert import BertEncoder
from normlab.models.video import VideoEncoder
from normlab.nn.feedforward import FeedForward


@pytest.mark.parametrize("make, units", [
    (lambda: normlab.ConformerEncoder(16, 4, 1, dropout=0.5, kernel_size=3).layers[0], ("ffn1", "attn", "ffn2")),
    (lambda: VideoEncoder(16, 4, 1, n_patches=3, dropout=0.5).layers[0], ("time", "space", "ffn")),
])
def test_every_branch_drops_out_in_training_and_none_in_eval(make, units):
    """The Conformer's FFN and attention branches and the divided video block's three had no dropout on their
    output (the paper's Conformer and the joint video mode have it): training with dropout 0.5 added them whole."""
    torch.manual_seed(0)
    block = make()
    x = torch.randn(2, 6, 16)
    for name in units:
        unit = getattr(block, name)
        for train in (True, False):
            unit.train(train)
            torch.manual_seed(1)
            hidden, residual = unit(x, None, None)
            added = hidden + (0 if residual is None else residual) - x  # what the branch adds to the stream
            zeros = (added.abs() < 1e-12).float().mean().item()
            if train:
                assert 0.3 < zeros < 0.7, (name, zeros)  # about half of the branch dropped
            else:
                assert zeros < 0.01, (name, zeros)


def test_video_sizes_are_checked_when_built():
    for kw, error in (({"d_ff": 0}, "d_ff"), ({"n_heads": 0}, "n_heads"), ({"dropout": float("nan")}, "dropout"),
                      ({"n_patches": 0}, "n_patches"), ({"n_patches": -1}, "n_patches")):
        args = {"n_heads": 4, "n_patches": 3, **kw}
        with pytest.raises(ValueError, match=error):
            VideoEncoder(16, args.pop("n_heads"), 1, **args)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish", "swiglu"])
def test_an_empty_sequence_passes_the_feed_forward_with_autograd_on(activation):
    ffn = FeedForward(8, 16, activation)
    for shape in ((2, 0, 8), (0, 3, 8)):
        x = torch.randn(*shape, requires_grad=True)
        out = ffn(x)
        assert out.shape == shape
        out.sum().backward()
        assert x.grad.shape == shape


def test_forward_mode_ad_through_the_feed_forward_under_no_grad():
    ffn = FeedForward(4, 8, "gelu").double()
    x, t = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    expected = jvp(ffn, (x,), (t,))[1]
    with torch.no_grad():
        assert torch.allclose(jvp(ffn, (x,), (t,))[1], expected)


def test_bert_refuses_what_it_cannot_read_in_one_line():
    cfg = dict(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
               max_position_embeddings=6)
    model = BertEncoder(cfg).eval()
    assert model(torch.randint(0, 50, (1, 6))).shape == (1, 6, 8)
    for ids, error in ((torch.randint(0, 50, (1, 7)), "positions"), (torch.randint(0, 50, (5,)), r"\(B, T\)"),
                       (torch.randn(1, 4), r"\(B, T\)"), (torch.ones(1, 4, dtype=torch.bool), r"\(B, T\)"),
                       (torch.tensor([[1, 50]]), r"\[0, 50\) .vocab_size"), (torch.tensor([[-1, 3]]), "vocab_size")):
        with pytest.raises(ValueError, match=error):
            model(ids)
    with pytest.raises(ValueError, match="type_vocab_size"):
        model(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="must match input_ids"):
        model(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0]]))
    with pytest.raises(ValueError, match="lacks intermediate_size"):
        BertEncoder({k: v for k, v in cfg.items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertEncoder({**cfg, "position_embedding_type": "relative_key"})
