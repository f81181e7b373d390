"""VBx clustering: the PLDA model's space, variational Bayes deciding the count, and the pipeline's checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from normlab._checks import BadValue
from normlab.diarization.models.eend import EENDModel
from normlab.diarization.pipeline import vbx
from normlab.diarization.pipeline.config import PipelineConfig


def _speakers(n_speakers: int, pieces: int, dim: int = 16, seed: int = 0, spread: float = 0.15):
    """Unit embeddings of ``n_speakers`` voices: each a random direction, its pieces scattered around it more
    along the first two axes (what one voice's pieces share) than along the others."""
    rng = np.random.default_rng(seed)
    scale = np.full(dim, spread)
    scale[:2] = 4 * spread
    groups = []
    for _ in range(n_speakers):
        centre = rng.normal(size=dim)
        centre /= np.linalg.norm(centre)
        g = centre + rng.normal(size=(pieces, dim)) * scale
        groups.append(g / np.linalg.norm(g, axis=1, keepdims=True))
    return groups


def test_plda_space_whitens_within_and_diagonalizes_between():
    plda = vbx.fit_groups(_speakers(60, 20))
    groups = _speakers(60, 20)
    y = [vbx.project(g, plda, 16)[0] for g in groups]
    within = sum((g - g.mean(0)).T @ (g - g.mean(0)) for g in y) / sum(len(g) for g in y)
    means = np.stack([g.mean(0) for g in y])
    between = np.cov(means.T, bias=True)
    assert np.allclose(within, np.eye(16), atol=1e-6)
    off = between - np.diag(np.diag(between))
    assert np.abs(off).max() < 1e-3 * np.diag(between).max()
    phi = plda["phi"].numpy()
    assert np.allclose(np.diag(between), phi, rtol=1e-3) and (np.diff(phi) <= 0).all()


def test_fit_needs_two_speakers():
    with pytest.raises(BadValue, match="fewer than two speakers"):
        vbx.fit_groups(_speakers(1, 10) + [np.ones((1, 16))])


def test_variational_bayes_drops_the_speakers_an_overclustered_start_invented():
    """Three voices started as six clusters (each voice split in two): VB keeps three, one per voice."""
    plda = vbx.fit_groups(_speakers(80, 20, seed=1))
    groups = _speakers(3, 30, seed=2)
    y, phi = vbx.project(np.concatenate(groups), plda, 16)
    truth = np.repeat(np.arange(3), 30)
    init = truth * 2 + (np.arange(90) % 2)  # six clusters
    gamma = vbx.vb(y, phi, init, fa=0.3, fb=1.0)
    labels = gamma.argmax(1)
    assert len(np.unique(labels)) == 3
    assert all(len(np.unique(labels[truth == k])) == 1 for k in range(3))
    # the speakers left without pieces have no responsibility left either
    assert np.sort(gamma.sum(0))[:3].max() < 1e-3


def test_cluster_vbx_keeps_voices_apart_and_obeys_the_count():
    plda = vbx.fit_groups(_speakers(80, 20, seed=1))
    x = np.concatenate(_speakers(2, 25, seed=3))
    labels = vbx.cluster_vbx(x, plda, threshold=0.05, fa=0.3, fb=1.0, dims=16)
    assert sorted(np.bincount(labels)) == [25, 25]
    assert len(np.unique(vbx.cluster_vbx(x, plda, threshold=0.05, fa=0.3, fb=1.0, dims=16, num_speakers=3))) == 3
    with pytest.raises(BadValue, match="fa > 0"):
        vbx.vb(x[:, :4], np.ones(4), np.zeros(50, dtype=int), fa=0.0, fb=1.0)
    with pytest.raises(BadValue, match="another speaker encoder"):
        vbx.project(x[:, :8], plda, 4)


def test_pipeline_asks_for_a_plda_model_and_not_with_whitening():
    model = EENDModel()
    with pytest.raises(BadValue, match="PLDA model"):
        PipelineConfig.for_model(model, clustering="vbx")
    plda = vbx.fit_groups(_speakers(10, 5))
    model.whitening = {"matrix": torch.eye(16), "plda": plda}
    assert PipelineConfig.for_model(model, clustering="vbx", cluster_threshold=0.3).clustering == "vbx"
    with pytest.raises(BadValue, match="whiten applies to 'ahc' only"):
        PipelineConfig.for_model(model, clustering="vbx", whiten=True, cluster_threshold=0.3)
    with pytest.raises(BadValue, match="clustering"):
        PipelineConfig.for_model(model, clustering="kmeans")


def test_a_vbx_choice_gives_way_to_the_trees_own_settings():
    """A model file whose mode was tuned to VBx (a low starting cut) keeps the tree's choice for
    ``clustering="ahc"``."""
    model = EENDModel()
    model.whitening = {"matrix": torch.eye(16), "plda": vbx.fit_groups(_speakers(10, 5))}
    model.postprocess["modes"] = {"eend": {"speakers": "eend", "clustering": "vbx", "cluster_threshold": 0.3,
                                           "vbx_fa": 0.3, "min_cluster": 4.0}}
    model.postprocess["ahc"] = {"eend": {"speakers": "eend", "clustering": "ahc", "cluster_threshold": 0.35,
                                         "min_cluster": 8.0}}
    cfg = PipelineConfig.for_model(model, speakers="eend")
    assert (cfg.clustering, cfg.cluster_threshold, cfg.vbx_fa, cfg.min_cluster) == ("vbx", 0.3, 0.3, 4.0)
    cfg = PipelineConfig.for_model(model, speakers="eend", clustering="ahc")
    assert (cfg.clustering, cfg.cluster_threshold, cfg.min_cluster) == ("ahc", 0.35, 8.0)


def test_clustering_vbx_brings_the_settings_chosen_for_it():
    model = EENDModel()
    model.whitening = {"matrix": torch.eye(16), "plda": vbx.fit_groups(_speakers(10, 5))}
    model.postprocess["modes"] = {"eend": {"speakers": "eend", "cluster_threshold": 0.35, "min_cluster": 8.0}}
    with pytest.raises(BadValue, match="no eend-mode settings chosen for VBx"):
        PipelineConfig.for_model(model, speakers="eend", clustering="vbx")
    assert PipelineConfig.for_model(model, speakers="eend", clustering="vbx", cluster_threshold=0.2).vbx_fa == 0.2
    model.postprocess["vbx"] = {"eend": {"speakers": "eend", "clustering": "vbx", "cluster_threshold": 0.3,
                                         "vbx_fa": 0.15, "min_cluster": 4.0}}
    cfg = PipelineConfig.for_model(model, speakers="eend", clustering="vbx")
    assert (cfg.clustering, cfg.cluster_threshold, cfg.vbx_fa, cfg.min_cluster) == ("vbx", 0.3, 0.15, 4.0)
    assert PipelineConfig.for_model(model, speakers="eend").clustering == "ahc"
