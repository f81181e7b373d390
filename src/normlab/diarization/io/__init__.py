"""Audio in (files, waveforms), EEND features, and the RTTM and UEM file formats."""
