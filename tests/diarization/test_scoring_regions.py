"""DER and the frame timelines score only inside the UEM: every region, and no recording the UEM leaves out."""
import math

import pytest

from normlab.diarization import Turn, diarization_error_rate
from normlab.diarization.metrics.der import score, speaker_mapping
from normlab.diarization.metrics.frame_errors import frame_errors


def T(s, e, spk, uri="a"):
    return Turn(uri, float(s), float(e - s), spk)


def test_every_uem_region_is_scored():
    r = diarization_error_rate([T(0, 10, "A")], [], uem=[(0.0, 1.0), (5.0, 6.0)])
    assert (r.missed, r.total) == pytest.approx((2.0, 2.0))


# ref A 0-3, B 3-10; hyp x 0-10. Over the whole recording x maps to B; inside the UEM [0, 3] to A.
REF_M, HYP_M = [T(0, 3, "A"), T(3, 10, "B")], [T(0, 10, "x")]

def test_der_maps_speakers_on_the_scored_region_only():
    r = diarization_error_rate(REF_M, HYP_M, uem=[(0.0, 3.0)])
    assert r.der == 0.0 and r.confusion == 0.0

def test_speaker_mapping_uses_the_scored_region_only():
    assert speaker_mapping(REF_M, HYP_M, uem=[(0.0, 3.0)]) == {"x": "A"}
    assert speaker_mapping(REF_M, HYP_M) == {"x": "B"}

def test_a_recording_missing_from_the_uem_is_not_scored():
    ref = {"a": [T(0, 4, "A", "a")], "b": [T(0, 4, "A", "b")]}
    r = score(ref, {}, uem={"a": [(0.0, 1.0)]})
    assert (r.missed, r.total) == pytest.approx((1.0, 1.0))

def test_false_alarm_without_reference_speech_is_infinite_der():
    r = diarization_error_rate([], [T(0, 1, "x")])
    assert r.false_alarm == pytest.approx(1.0) and r.der == math.inf
    assert diarization_error_rate([], []).der == 0.0

def test_frame_errors_count_only_inside_the_uem():
    err = frame_errors([T(0, 3, "A")], [], uem=[(0.0, 1.0), (2.0, 3.0)])
    assert err.seconds("missed") == pytest.approx(2.0)
    assert [(round(a, 6), round(b, 6)) for a, b in err.spans("missed")] == [(0.0, 1.0), (2.0, 3.0)]

def test_frame_errors_of_a_long_uem_cover_the_turns_not_the_uem():
    """The frames spanned the whole UEM: one a million seconds long (the readers take it) made 10^8 frames for a
    few seconds of speech, and ``evaluate --html`` ran out of memory. The counts and spans are the same."""
    ref, hyp = [T(1, 5, "A"), T(4, 5, "B")], [T(1, 8, "x")]
    short, long = frame_errors(ref, hyp, uem=[(0.0, 10.0)]), frame_errors(ref, hyp, uem=[(0.0, 1e4)])
    assert long.missed.size <= 800
    for kind in ("missed", "false_alarm", "confusion"):
        assert long.seconds(kind) == short.seconds(kind) and long.spans(kind) == short.spans(kind)
    assert frame_errors([], [], uem=[(0.0, 1e4)]).missed.size == 0


def test_frame_errors_map_speakers_on_the_uem():
    err = frame_errors(REF_M, HYP_M, uem=[(0.0, 3.0)])
    assert err.mapping == {"x": "A"}
    assert err.seconds("confusion") == 0.0
