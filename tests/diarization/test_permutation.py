"""One permutation utility for PIT (training) and chunk stitching (inference); tests that catch the planted bugs:
PIT choosing one permutation for the whole batch, and stitching that keeps each chunk's own speaker order."""
import pytest
import torch
from torch import nn

from normlab.diarization.metrics.evaluate import frame_probs
from normlab.diarization.models.eend import ModelConfig
from normlab.diarization.training.permutation import align, best_per_sequence, match, permutations
from normlab.diarization.training.pit import pit_bce


def test_permutations_table():
    p = permutations(3)
    assert p.shape == (6, 3) and p[0].tolist() == [0, 1, 2]
    assert len({tuple(r) for r in p.tolist()}) == 6
    with pytest.raises(ValueError):
        permutations(0)


def test_best_per_sequence_is_per_row():
    costs = torch.tensor([[0.0, 5.0, 5.0], [5.0, 0.0, 5.0], [5.0, 5.0, 0.0]])
    assert best_per_sequence(costs).tolist() == [0, 1, 2]


def test_pit_finds_each_sequences_own_permutation():
    """4 sequences, 3 speakers, each labelled in a different speaker order: loss near 0, the planted orders back."""
    torch.manual_seed(0)
    b, t, s = 4, 60, 3
    active = (torch.rand(b, t, s) > 0.5).float()  # the model's view
    planted = [[0, 1, 2], [2, 0, 1], [1, 2, 0], [0, 2, 1]]
    labels = torch.stack([active[i][:, torch.argsort(torch.tensor(p))] for i, p in enumerate(planted)])
    logits = (2 * active - 1) * 12.0  # confident and right, in the model's order
    loss, perms = pit_bce(logits, labels)
    assert loss.item() < 1e-3, "PIT must pick the best label order per sequence, not one per batch"
    for i, p in enumerate(planted):
        assert torch.equal(labels[i][:, perms[i]], active[i])
        assert perms[i].tolist() == p


def test_match_and_align_recover_a_permutation():
    torch.manual_seed(1)
    ref = (torch.rand(50, 4) > 0.5).float()
    order = [2, 0, 3, 1]
    hyp = ref[:, torch.argsort(torch.tensor(order))]  # columns shuffled
    assert torch.equal(hyp[:, match(ref, hyp)], ref)
    aligned = align(ref, torch.cat([hyp[-10:], hyp[:5]]), overlap=10)
    assert torch.equal(aligned[:10], ref[-10:])
    with pytest.raises(ValueError, match="shape"):
        match(ref, hyp[:, :3])


class FlippingModel(nn.Module):
    """A stand-in EEND model that reads the true activity from its input but outputs the speakers in a different
    order on every call (as a real model may on every chunk): 3 speakers, rotated by the call count."""

    def __init__(self):
        super().__init__()
        self.cfg = ModelConfig(n_speakers=3)
        self.calls = 0
        self.unused = nn.Parameter(torch.zeros(1))  # a module with parameters, as a real model

    def forward(self, feats, key_padding_mask=None):
        logits = (2 * feats[..., :3] - 1) * 12.0  # B, T, 3
        shift = self.calls % 3
        self.calls += 1
        return logits.roll(shift, dims=-1)

    def activity(self, feats, key_padding_mask=None):  # EENDModel's reading of a multi-label head
        return torch.sigmoid(self(feats, key_padding_mask))


def test_chunk_stitching_follows_flipping_speaker_order():
    torch.manual_seed(2)
    t = 400
    truth = torch.zeros(t, 3)
    for k in range(3):  # each speaker talks in random bursts
        for start in torch.randint(0, t - 20, (8,)).tolist():
            truth[start : start + 15, k] = 1
    feats = torch.cat([truth, torch.zeros(t, 2)], dim=1)
    probs = frame_probs(FlippingModel(), feats, chunk_frames=100, overlap_frames=40)
    assert probs.shape == (t, 3)
    # the first chunk's order holds everywhere: one global permutation maps the output to the truth
    order = match(truth, probs)
    agreement = ((probs[:, order] > 0.5).float() == truth).float().mean().item()
    assert agreement == 1.0, f"stitched chunks disagree with the truth on {100 * (1 - agreement):.1f}% of frames"
