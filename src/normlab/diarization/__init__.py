"""Speaker diarization ("who spoke when") on normlab encoders.

This package so far has the formats (RTTM, UEM), the Diarization Error Rate
with collars, UEM and overlap options, and the permutation-invariant loss.
"""
from .der import DERResult, diarization_error_rate
from .pit import pit_bce
from .rttm import Turn, read_rttm, read_uem, write_rttm, write_uem

__all__ = ["Turn", "read_rttm", "write_rttm", "read_uem", "write_uem", "DERResult", "diarization_error_rate",
           "pit_bce"]
