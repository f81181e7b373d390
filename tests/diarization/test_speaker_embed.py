"""``SpeakerEncoder.embed_frames`` (called directly, random weights): the L2-normalized mean over all 1.6 s partials."""
import torch

from normlab.diarization.models.embed import PARTIAL, SpeakerEncoder


def test_embedding_is_the_normalized_mean_of_every_partial():
    torch.manual_seed(0)
    enc = SpeakerEncoder().eval()
    mel = torch.rand(1000, 40)
    mel[260:420] = 50 * torch.rand(160, 40) ** 4  # the three partials of the long group sound different
    mel[420:500, :20] = 0
    long_group = torch.arange(100, 100 + 2 * PARTIAL + 80)  # two partials and a rest of 80 >= 50 frames
    short_group = torch.arange(600, 700)  # shorter than one partial: one partial of its own length
    tiny = torch.arange(900, 920)  # fewer than min_frames: no embedding
    out = enc.embed_frames(mel, [long_group, short_group, tiny])
    assert out.shape == (3, 256)
    with torch.no_grad():
        frames = mel[long_group]
        partials = enc(torch.stack([frames[0:PARTIAL], frames[PARTIAL : 2 * PARTIAL], frames[-PARTIAL:]]))  # 3, 256
        mean = partials.mean(0)
        short = enc(mel[short_group][None])[0]
    torch.testing.assert_close(out[0], mean / mean.norm())
    assert not torch.allclose(out[0], partials[0], atol=1e-3)  # not the first partial alone: the partials differ
    torch.testing.assert_close(out[0].norm(), torch.tensor(1.0))
    assert mean.norm() < 0.999  # so the normalization of the mean is needed, not implied by the partials'
    torch.testing.assert_close(out[1], short)
    assert torch.isnan(out[2]).all()


def test_a_meta_device_build_of_the_speaker_encoder_loads_into_the_same_encoder():
    """The mel window and filterbank were non-persistent buffers: after a meta-device build, ``to_empty()``
    and ``load_state_dict()`` they held whatever memory held."""
    torch.manual_seed(0)
    ref = SpeakerEncoder(hidden=16, layers=1, dim=8)
    with torch.device("meta"):
        built = SpeakerEncoder(hidden=16, layers=1, dim=8)
    built.to_empty(device="cpu")
    built.load_state_dict(ref.state_dict())
    wave = torch.randn(4000)
    assert torch.equal(built.mel(wave), ref.mel(wave))
    assert torch.equal(built.features(wave, block=7), ref.features(wave, block=7))
    assert torch.allclose(built.double().mel(wave.double()), ref.mel(wave), rtol=1e-4, atol=1e-6)  # float64 runs
