"""The powerset head: its classes, the permutation-invariant cross-entropy, speaker marginals, save and load."""
import itertools

import pytest
import soundfile as sf
import torch
import torch.nn.functional as TF

from normlab.diarization import diarize
from normlab.diarization.models.eend import EENDModel, ModelConfig
from normlab.diarization.models.embed import SpeakerEncoder
from normlab.diarization.models.powerset import classes_of, marginals, n_classes, subsets
from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.segment import segment
from normlab.diarization.training.pit import pit_powerset
from normlab.diarization.training.train import TrainConfig, train
from tiny_diarizer import SR, tiny_models, tones

POWERSET = ModelConfig(input_dim=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, n_speakers=3, head="powerset",
                       dropout=0.0)


def test_classes_are_every_set_of_at_most_k_speakers_once():
    for s, k in ((4, 2), (3, 3), (4, 1), (2, 5)):
        t = subsets(s, k)
        assert t.shape == (n_classes(s, k), s)
        sets = [tuple(r.nonzero().squeeze(1).tolist()) for r in t]
        expected = [c for i in range(min(k, s) + 1) for c in itertools.combinations(range(s), i)]
        assert sets == expected  # the empty set first, then singles, pairs...
    assert n_classes(4, 2) == 11 and n_classes(4, 3) == 15


def test_classes_of_inverts_the_table_and_marks_sets_it_cannot_hold():
    t = subsets(4, 2)
    assert classes_of(t, t).tolist() == list(range(11))
    three = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert classes_of(three, t).tolist() == [-1, 0]


def test_marginals_sum_the_classes_holding_each_speaker():
    t = subsets(3, 2)
    sets = [tuple(r.nonzero().squeeze(1).tolist()) for r in t]
    logits = torch.full((1, 2, len(sets)), -30.0)
    logits[0, 0, sets.index((0, 2))] = 30.0  # frame 0: speakers 0 and 2 for sure
    for c in ((1,), (), (0, 1)):  # frame 1: speaker 1, silence, or speakers 0 and 1, even odds
        logits[0, 1, sets.index(c)] = 0.0
    p = marginals(logits, t)
    torch.testing.assert_close(p[0], torch.tensor([[1.0, 0.0, 1.0], [1 / 3, 2 / 3, 0.0]]), atol=1e-6, rtol=0)


def _brute(logits, labels, table, mask):
    """The loss written out: per sequence, the permutation with the lowest mean CE over the frames it can score."""
    per_seq = []
    for i in range(logits.shape[0]):
        best = None
        for p in itertools.permutations(range(labels.shape[2])):
            cls = classes_of(labels[i][:, list(p)], table)
            keep = (cls >= 0) & ~mask[i]
            ce = TF.cross_entropy(logits[i][keep], cls[keep]) if keep.any() else logits.new_zeros(())
            best = ce if best is None or ce < best else best
        per_seq.append(best)
    return torch.stack(per_seq).mean()


def test_pit_powerset_is_the_best_permutation_per_sequence():
    g = torch.Generator().manual_seed(0)
    t = subsets(3, 2)
    logits = torch.randn(4, 20, len(t), generator=g, dtype=torch.float64)
    labels = (torch.rand(4, 20, 3, generator=g) > 0.6).float()
    mask = torch.zeros(4, 20, dtype=torch.bool)
    mask[1, 15:] = True
    loss, perms = pit_powerset(logits, labels, t, mask)
    torch.testing.assert_close(loss, _brute(logits, labels, t, mask))
    # the outputs' order is arbitrary: relabelling the speakers of one sequence changes nothing
    shuffled = labels.clone()
    shuffled[2] = labels[2][:, [2, 0, 1]]
    torch.testing.assert_close(pit_powerset(logits, shuffled, t, mask)[0], loss)
    # frames where three speakers talk are not scored, whatever the model says there
    three = labels.sum(-1) == 3
    assert three.any()
    other = logits.clone()
    other[three] = torch.randn(int(three.sum()), len(t), generator=g, dtype=torch.float64)
    torch.testing.assert_close(pit_powerset(other, labels, t, mask)[0], loss)
    assert perms.shape == (4, 3)


def test_powerset_model_trains_saves_and_loads(tmp_path):
    torch.manual_seed(0)

    def batches(gen):  # speaker k talks where feature k is positive: overlap is common
        feats = torch.randn(4, 30, 8, generator=gen)
        return feats, (feats[..., :3] > 0.3).float(), torch.zeros(4, 30, dtype=torch.bool)

    m = EENDModel(POWERSET)
    assert m(torch.randn(2, 12, 8)).shape == (2, 12, n_classes(3, 2))
    losses = train(m, batches, TrainConfig(steps=60, lr=3e-3, warmup=10, ckpt_every=30), tmp_path)
    assert sum(losses[-10:]) < 0.7 * sum(losses[:10])
    m.eval()
    x = torch.randn(2, 12, 8)
    with torch.no_grad():
        p = m.activity(x)
    assert p.shape == (2, 12, 3) and float(p.min()) >= 0 and float(p.sum(-1).max()) <= 2 + 1e-5
    m.save(tmp_path / "ps.pt")
    back = EENDModel.load(tmp_path / "ps.pt")
    assert back.cfg.head == "powerset"
    with torch.no_grad():
        torch.testing.assert_close(back.activity(x), p)
    with pytest.raises(ValueError, match="max_active"):
        EENDModel(ModelConfig(**{**POWERSET.__dict__, "max_active": 0}))
    with pytest.raises(ValueError, match="head"):
        EENDModel(ModelConfig(head="softmax"))


def test_the_pipeline_runs_a_powerset_model(tmp_path):
    """The whole pipeline on a powerset model file: its speakers' marginals are what the windows hold."""
    m, enc = tiny_models(tmp_path, 2.0, head="powerset", window=4.0, step=2.0, speakers="eend", vad="off")
    audio = tones(12)
    sf.write(tmp_path / "talk.wav", audio, SR)
    turns = diarize(tmp_path / "talk.wav", model=m, embedding=enc)
    assert turns and {t.uri for t in turns} == {"talk"}
    model = EENDModel.load(m)
    seg = segment(model, SpeakerEncoder.load(enc), torch.from_numpy(audio), "talk", PipelineConfig.for_model(model))
    assert seg.probs.shape[2] == 3 and float(seg.probs.min()) >= 0 and float(seg.probs.sum(2).max()) <= 2 + 1e-5


def test_a_meta_device_build_of_a_powerset_model_loads_into_the_same_model():
    """The class table was a non-persistent buffer: after a meta-device build, ``to_empty()`` and
    ``load_state_dict()`` it held whatever memory held, and the speaker probabilities were garbage."""
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, n_speakers=3, head="powerset", max_active=2)
    torch.manual_seed(0)
    ref = EENDModel(cfg).eval()
    with torch.device("meta"):
        built = EENDModel(cfg)
    built.to_empty(device="cpu")
    built.load_state_dict(ref.state_dict())
    feats = torch.randn(2, 7, cfg.input_dim)
    assert torch.equal(built.eval().activity(feats), ref.activity(feats))
