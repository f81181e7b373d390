"""Every placement x norm builds, runs forward/backward, and ignores padding."""
import pytest
import torch

import normlab
from normlab.nn.residual import materialize
from normlab.registry import NORMS, PLACEMENTS

D, H = 16, 4


def _padded_pair(seed=0, t_short=5, t_long=8, in_dim=None):
    g = torch.Generator().manual_seed(seed)
    d = in_dim or D
    alone = torch.randn(1, t_short, d, generator=g)
    other = torch.randn(1, t_long, d, generator=g)
    batch = torch.zeros(2, t_long, d)
    batch[0, :t_short] = alone[0]
    batch[0, t_short:] = 99.0  # garbage in the padding must not matter
    batch[1] = other[0]
    mask = torch.zeros(2, t_long, dtype=torch.bool)
    mask[0, t_short:] = True
    return alone, batch, mask


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("norm", list(NORMS))
def test_every_combination_runs_and_ignores_padding(placement, norm):
    torch.manual_seed(0)
    m = normlab.TransformerEncoder(D, H, 4, 32, norm=norm, placement=placement, input_dim=6)
    alone, batch, mask = _padded_pair(in_dim=6)
    y = m(batch, mask)
    assert y.shape == (2, 8, D) and torch.isfinite(y).all()
    y.sum().backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)
    m.eval()
    y_alone, y_batch = m(alone), m(batch, mask)
    if norm == "batchnorm":
        m.train()  # batch statistics: the valid frames of the other sequence change the result
        assert not torch.allclose(m(alone), m(batch, mask)[:1, :5], atol=1e-3)
    else:
        torch.testing.assert_close(y_batch[:1, :5], y_alone, rtol=1e-5, atol=1e-5)
        m.train()
        torch.testing.assert_close(m(batch, mask)[:1, :5], m(alone), rtol=1e-5, atol=1e-5)


def test_batchnorm_eval_uses_running_stats_and_is_padding_invariant():
    m = normlab.TransformerEncoder(D, H, 2, 32, norm="batchnorm", placement="pre")
    alone, batch, mask = _padded_pair()
    for _ in range(3):
        m(batch, mask)  # train mode: update running statistics from valid frames only
    assert m.layers[0].attn.pre_norm.num_batches_tracked.item() == 3
    m.eval()
    torch.testing.assert_close(m(batch, mask)[:1, :5], m(alone), rtol=1e-5, atol=1e-5)


def test_causal_mask_blocks_the_future():
    m = normlab.TransformerEncoder(D, H, 2, causal=True).eval()
    x = torch.randn(1, 6, D)
    x2 = x.clone()
    x2[:, 4:] += 5.0 * torch.randn(1, 2, D)  # a shift alone would vanish in the pre-norm
    torch.testing.assert_close(m(x)[:, :4], m(x2)[:, :4])
    assert not torch.allclose(m(x)[:, 4:], m(x2)[:, 4:])


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu"])
@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "none"])
def test_activations_and_positions(activation, pos):
    m = normlab.TransformerEncoder(D, H, 2, activation=activation, pos=pos)
    assert m(torch.randn(2, 5, D)).shape == (2, 5, D)


def test_fused_pre_block_matches_unfused():
    """The pre block's fused add+norm gives what separate add and norm give."""
    torch.manual_seed(0)
    b = normlab.TransformerBlock(D, H, 32, placement="pre")
    x = torch.randn(2, 5, D)
    h = x + b.attn.fn(b.attn.pre_norm(x))
    expected = h + b.ffn.fn(b.ffn.pre_norm(h))
    hidden, residual = b(x)
    assert residual is not None  # a pre block leaves its last add to the next norm
    torch.testing.assert_close(materialize(hidden, residual), expected, rtol=1e-5, atol=1e-5)


def test_conformer_structure_and_padding():
    torch.manual_seed(0)
    blk = normlab.ConformerBlock(D, H, kernel_size=5)
    assert blk.ffn1.scale == 0.5 and blk.ffn2.scale == 0.5
    assert all(u.slots.pre for u in (blk.ffn1, blk.attn, blk.conv, blk.ffn2))
    x = torch.randn(3, 9, D) * 4 + 2
    y, pending = blk(x)
    assert pending is None  # the block's final norm closed the stream
    assert y.mean(-1).abs().max() < 1e-5  # ends with a LayerNorm (gamma 1, beta 0)
    assert (y.std(-1, unbiased=False) - 1).abs().max() < 1e-3
    enc = normlab.ConformerEncoder(D, H, 2, input_dim=6, kernel_size=5).eval()
    alone, batch, mask = _padded_pair(in_dim=6)
    torch.testing.assert_close(enc(batch, mask)[:1, :5], enc(alone), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="odd"):
        normlab.ConformerBlock(D, H, kernel_size=4)


@pytest.mark.parametrize("attention", ["joint", "divided"])
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_video_encoder(attention, placement):
    torch.manual_seed(0)
    m = normlab.VideoEncoder(D, H, 2, n_patches=3, attention=attention, placement=placement).eval()
    x = torch.randn(2, 4, 3, D)  # B, T, N, D
    fm = torch.zeros(2, 4, dtype=torch.bool)
    fm[0, 3:] = True
    y = m(x, fm)
    assert y.shape == (2, 4, 3, D)
    torch.testing.assert_close(y[:1, :3], m(x[:1, :3]), rtol=1e-5, atol=1e-5)  # padded frame ignored
    with pytest.raises(ValueError, match="patches"):
        m(torch.randn(1, 2, 5, D))


def test_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        normlab.TransformerBlock(10, 3)
    with pytest.raises(ValueError, match="activation"):
        normlab.TransformerBlock(8, 2, activation="tanh")
    with pytest.raises(ValueError, match="positional"):
        normlab.TransformerEncoder(8, 2, 1, pos="rope")
    with pytest.raises(TypeError, match="bool"):
        normlab.TransformerEncoder(8, 2, 1)(torch.randn(1, 3, 8), torch.zeros(1, 3))
    with pytest.raises(TypeError, match="mask="):  # the second argument of a block is the residual stream
        normlab.TransformerBlock(8, 2)(torch.randn(1, 3, 8), torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_layers"):
        normlab.ConformerEncoder(8, 2, 0)
    with pytest.raises(ValueError, match="layer_index"):
        normlab.TransformerBlock(8, 2, layer_index=4, n_layers=4)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("norm", list(NORMS))
def test_video_every_placement_and_norm(placement, norm):
    m = normlab.VideoEncoder(D, H, 2, n_patches=3, attention="divided", norm=norm, placement=placement)
    fm = torch.zeros(2, 4, dtype=torch.bool)
    fm[1, 3:] = True
    y = m(torch.randn(2, 4, 3, D), fm)
    assert y.shape == (2, 4, 3, D) and torch.isfinite(y).all()
    y.sum().backward()


@pytest.mark.parametrize("make", [lambda: normlab.TransformerEncoder(16, 4, 1, norm="batchnorm"),
                                  lambda: normlab.ConformerEncoder(16, 4, 1, kernel_size=3)])
@pytest.mark.parametrize("mask, error", [
    (torch.zeros(3, 1, dtype=torch.bool), "padding mask has shape \\[3, 1\\]"),  # broadcast: it masked every key
    (torch.zeros(1, 6, dtype=torch.bool), "padding mask has shape \\[1, 6\\]"),  # broadcast over the batch
    (torch.zeros(3, 7, dtype=torch.bool), "padding mask has shape"), (torch.zeros(6, dtype=torch.bool), "shape"),
    (torch.zeros(3, 6), "must be a bool tensor"), (torch.zeros(3, 6, dtype=torch.uint8), "must be a bool tensor"),
    ([[False] * 6] * 3, "must be a bool tensor"), (torch.zeros(3, 6, dtype=torch.bool, device="meta"), "is on meta"),
])
def test_a_padding_mask_that_does_not_fit_is_refused_before_any_layer(make, mask, error):
    """One clear error, and no statistics updated (a batchnorm in training used a uint8 mask as weights first)."""
    model = make().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises((ValueError, TypeError), match=error):
        model(torch.randn(3, 6, 16), mask)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("kw, error", [
    ({"n_heads": 0}, "n_heads"), ({"n_heads": -4}, "n_heads"), ({"n_heads": 2.0}, "n_heads"),
    ({"d_model": 0}, "d_model"),
    ({"d_ff": 0}, "d_ff"), ({"d_ff": -5}, "d_ff"), ({"attn_dropout": -0.1}, "attn_dropout"),
    ({"attn_dropout": 1.5}, "attn_dropout"), ({"dropout": float("nan")}, "dropout"), ({"max_len": 0}, "max_len"),
    ({"input_dim": 0}, "input_dim"), ({"input_dim": -3}, "input_dim"),
])
@pytest.mark.parametrize("encoder", ["TransformerEncoder", "ConformerEncoder"])
def test_encoder_sizes_are_checked_when_built(kw, error, encoder):
    args = {"d_model": 16, "n_heads": 4, "n_layers": 1, **kw}
    with pytest.raises(ValueError, match=error):
        getattr(normlab, encoder)(args.pop("d_model"), args.pop("n_heads"), args.pop("n_layers"), **args)


def test_conformer_kernel_size_and_empty_sequences():
    with pytest.raises(ValueError, match="kernel_size"):
        normlab.ConformerEncoder(16, 4, 1, kernel_size=-1)
    enc = normlab.ConformerEncoder(16, 4, 2, kernel_size=3)
    for mode in (enc.eval(), enc.train()):
        assert mode(torch.randn(2, 0, 16)).shape == (2, 0, 16)
    with pytest.raises(ValueError, match=r"expected input of shape \(B, T, 16\)"):
        enc(torch.randn(2, 5, 8))


@pytest.mark.parametrize("placement", ["deepnorm", "admin", "pre"])
def test_a_meta_device_build_loads_into_the_same_model(placement):
    """The usual large-model recipe: build on the meta device, ``to_empty()``, ``load_state_dict()``. The
    residual scale and the sinusoidal table were non-persistent buffers, left as whatever memory held
    (DeepNorm's output NaN, every sinusoidal model wrong)."""
    torch.manual_seed(0)
    ref = normlab.TransformerEncoder(16, 2, 3, 32, placement=placement, pos="sinusoidal").eval()
    with torch.device("meta"):
        built = normlab.TransformerEncoder(16, 2, 3, 32, placement=placement, pos="sinusoidal")
    built.to_empty(device="cpu")
    built.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 16)
    assert torch.equal(built.eval()(x), ref(x))
    assert torch.equal(built.double()(x.double()), ref.double()(x.double()))


def test_a_meta_device_build_of_the_video_encoder_loads_into_the_same_model():
    """Its frame positions were a non-persistent buffer too: NaN after to_empty() and load_state_dict()."""
    from normlab.models.video import VideoEncoder

    torch.manual_seed(0)
    ref = VideoEncoder(16, 2, 2, 32, n_patches=3).eval()
    with torch.device("meta"):
        built = VideoEncoder(16, 2, 2, 32, n_patches=3)
    built.to_empty(device="cpu")
    built.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 3, 16)
    assert torch.equal(built.eval()(x), ref(x))
    with pytest.raises(ValueError, match="sequence length 4 exceeds max_frames 2"):
        VideoEncoder(16, 2, 1, n_patches=3, max_frames=2)(x)


@pytest.mark.parametrize("make", [lambda: normlab.TransformerBlock(16, 4, 32),
                                  lambda: normlab.ConformerBlock(16, 4, 32, kernel_size=3)])
@pytest.mark.parametrize("mask", [torch.zeros(1, 5, dtype=torch.bool), torch.zeros(5, dtype=torch.bool),
                                  torch.zeros(2, 6, dtype=torch.bool)])
def test_a_block_alone_refuses_a_mask_of_another_shape(make, mask):
    """A block used on its own took a (1, T) mask for every sequence of the batch (broadcast); other shapes
    failed inside torch. Its docstring, the encoder and torch's own layer all ask (B, T)."""
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="padding mask has shape"):
        materialize(*make().eval()(x, mask=mask))
    with pytest.raises(ValueError, match=r"attention needs an input of shape \(B, T, 16\)"):
        make().eval()(torch.randn(5, 16))


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_an_input_of_another_dtype_than_the_encoder_is_one_line(placement):
    """float64 or float16 frames into a float32 encoder failed inside its first Linear (torch's RuntimeError, a
    traceback in the CLI), and an integer input got normlab's error or torch's by placement."""
    x = torch.randn(2, 5, 16)
    enc = normlab.TransformerEncoder(16, 4, 1, 32, placement=placement)
    for bad in (x.double(), x.half()):
        with pytest.raises(TypeError, match=f"the input is {bad.dtype} but the encoder's parameters are "
                                            "torch.float32"):
            enc(bad)
    with pytest.raises(TypeError, match="the input is torch.int64: the encoder needs floating-point input"):
        enc(torch.ones(2, 5, 16, dtype=torch.long))
    with pytest.raises(TypeError, match="the input is torch.float64"):
        normlab.VideoEncoder(16, 4, 1, 32, n_patches=3)(torch.randn(2, 5, 3, 16).double())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's layers cast the input: accepted
        assert enc(x.bfloat16()).shape == (2, 5, 16)
    assert enc.double()(x.double()).dtype == torch.float64


def test_n_layers_takes_any_whole_number_as_the_other_sizes_do():
    """numpy's integers were refused for n_layers alone ("must be an int >= 1, got np.int64(2)")."""
    np = pytest.importorskip("numpy")
    assert len(normlab.TransformerEncoder(np.int64(16), 4, np.int64(2)).layers) == 2
    with pytest.raises(ValueError, match="n_layers must be a whole number >= 1"):
        normlab.TransformerEncoder(16, 4, np.int64(0))


@pytest.mark.parametrize("make", [lambda: normlab.TransformerBlock(8, 2, placement="post"),
                                  lambda: normlab.TransformerBlock(8, 2, norm="none"),
                                  lambda: normlab.TransformerBlock(8, 2),
                                  lambda: normlab.ConformerBlock(8, 2, placement="post")])
def test_a_block_called_by_itself_checks_what_an_encoder_checks(make):
    """A post-style block reached torch's "mat1 and mat2 shapes cannot be multiplied", a float64 input "must have
    the same dtype", an integer residual was added as it was, a list one raised AttributeError."""
    block = make()
    x = torch.randn(2, 5, 8)
    for args, error, says in (((torch.randn(2, 5, 7),), ValueError, r"expected hidden of shape \(B, T, 8\)"),
                              ((x.double(),), TypeError, "the input is torch.float64 but the block's parameters"),
                              ((x.long(),), TypeError, "the block needs floating-point input"),
                              ((x, [0.0]), TypeError, "residual .* must be a floating-point tensor or None, got list"),
                              ((x, x.long()), TypeError, "floating-point tensor or None, got torch.int64")):
        with pytest.raises(error, match=says):
            block(*args)


@pytest.mark.parametrize("norm", ["scalenorm", "dyt"])
def test_a_norm_without_a_fused_kernel_refuses_a_residual_that_is_not_a_stream(norm):
    """ScaleNorm and DyT added a bool mask given as the residual as 0/1, and an integer one as it was."""
    module = normlab.make_norm(norm, 8)
    x = torch.randn(2, 5, 8)
    for residual in (x > 0, x.long()):
        with pytest.raises(TypeError, match="residual must be a floating-point tensor"):
            module(x, residual)


def test_values_that_built_a_wrong_thing_are_refused_when_given():
    """max_frames=0 built an encoder refusing every clip; momentum=True a BatchNorm at momentum 1; the 'none' norm
    took any size; the FLOP count a KeyError for an unknown norm and negative FLOPs for a negative size."""
    from normlab.lab.accounting import flops_per_token
    from normlab.registry import make_norm

    for build, says in ((lambda: normlab.VideoEncoder(8, 2, 1, n_patches=4, max_frames=0), "max_frames"),
                        (lambda: make_norm("batchnorm", 8, momentum=True), "momentum"),
                        (lambda: make_norm("none", -3), "dim must be a whole number"),
                        (lambda: flops_per_token(8, 16, 10, norm="foo"), "unknown norm 'foo'"),
                        (lambda: flops_per_token(-1, 16, 10), "d_model must be a whole number")):
        with pytest.raises(ValueError, match=says):
            build()


def test_block_options_that_are_not_flags_and_unknown_block_arguments_are_refused():
    """causal="no" ran causal attention (equal to causal=True), bias="no" kept the biases; an unknown block
    argument (kernel_size for a Transformer) was the block constructor's TypeError, norm='none' took any
    norm_kw."""
    import normlab
    from normlab.nn import FeedForward

    with pytest.raises(TypeError, match="^causal must be True or False, got 'no'$"):
        normlab.TransformerEncoder(8, 2, 1, causal="no")
    with pytest.raises(TypeError, match="^bias must be True or False, got 'no'$"):
        normlab.TransformerBlock(8, 2, bias="no")
    with pytest.raises(TypeError, match="^bias must be True or False, got 'False'$"):
        FeedForward(8, 16, bias="False")
    with pytest.raises(ValueError, match="^'kernel_size': not an argument of TransformerEncoder or its "
                                         "TransformerBlock; the block's own: attn_dropout, activation, causal, bias$"):
        normlab.TransformerEncoder(8, 2, 1, kernel_size=3)
    with pytest.raises(ValueError, match="^'activation': not an argument of ConformerEncoder or its ConformerBlock"):
        normlab.ConformerEncoder(8, 2, 1, activation="relu")
    assert normlab.ConformerEncoder(8, 2, 1, kernel_size=3) is not None
    with pytest.raises(ValueError, match=r"^'eps': not an argument of norm 'none' \(no norm\); valid: none$"):
        normlab.TransformerEncoder(8, 2, 1, norm="none", norm_kw={"eps": 1e-3})
