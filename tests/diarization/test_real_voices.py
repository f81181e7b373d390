"""The shipped model on conversations of real people it has never heard (the test split's persons)."""
import pytest
import torch

from normlab.diarization import SHIPPED, EENDModel, ModelConfig
from normlab.diarization.data import prompts
from normlab.diarization.data.simulate import SimConfig, simulate
from normlab.diarization.metrics.evaluate import evaluate
from normlab.diarization.metrics.windows import window_probs
from normlab.diarization.training import provenance

# measured: 13.0% on 40 such conversations (the model before: 14.0%; docs/diarization.md); random weights: far
# above 100%
REAL_TEST_DER_BOUND = 0.30
#: the whole default pipeline on the 6 conversations below, collar 0.25: measured 12.5% with the model before (on
#: the 40 test conversations this model reads 5.19%, Silero alone deciding speech 12.74%: docs/diarization.md);
#: random weights: ~100%
PIPELINE_BOUND = 0.30

needs_test_persons = pytest.mark.skipif(len(prompts.installed("test")) < 2,
                                        reason="the test split's prompt packages are not installed (make system-deps)")


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    out = tmp_path_factory.mktemp("real_test")
    cfg = SimConfig(n_mixtures=6, n_speakers=2, min_speakers=1, split="test", sources="real", augment=True,
                    style="conversation", seed=11)
    return simulate(out, cfg)


def _local_der(model, folder):
    probs, ref = window_probs(model, folder, 100)
    return evaluate(probs, ref, collar=0.25, threshold=0.5, median=11).der


@needs_test_persons
def test_shipped_model_segments_unheard_real_people(conversations):
    der = _local_der(EENDModel.load(), conversations)
    assert der < REAL_TEST_DER_BOUND, f"local DER {100 * der:.1f}% on held-out real-voice conversations"


@needs_test_persons
def test_the_bound_fails_random_weights(conversations):
    torch.manual_seed(0)
    shipped = EENDModel.load()
    random = EENDModel(ModelConfig(**{**shipped.cfg.__dict__}))
    assert _local_der(random.eval(), conversations) > REAL_TEST_DER_BOUND


def _pipeline_der(folder, **options):
    from normlab.diarization import diarize
    from normlab.diarization.io.rttm import read_rttm
    from normlab.diarization.metrics.der import score

    ref = read_rttm(folder / "ref.rttm")
    hyp = {uri: diarize(folder / "wav" / f"{uri}.wav", uri=uri, **options) for uri in ref}
    return score(ref, hyp, collar=0.25).der


@needs_test_persons
def test_default_pipeline_on_unheard_real_people(conversations):
    """The settings stored in the shipped model (chosen on the dev set) on people nobody tuned on."""
    der = _pipeline_der(conversations)
    assert der < PIPELINE_BOUND, f"pipeline DER {100 * der:.1f}% on held-out real-voice conversations"


def test_shipped_model_records_its_real_voices_and_their_licences():
    meta = provenance.read(SHIPPED)
    licences = meta["train_sources"]["licences"]
    for key in prompts.SPLIT_PERSONS["train"]:
        person = prompts.person(key)
        assert f"recorded.{key}" in meta["train_sources"]["voices"]
        assert all(licences.get(pkg) == person.licence for pkg in person.packages)
    held_out = prompts.SPLIT_PERSONS["dev"] + prompts.SPLIT_PERSONS["test"]
    assert not any(v.split(".")[1] in held_out for v in meta["train_sources"]["voices"] if v.startswith("recorded."))
