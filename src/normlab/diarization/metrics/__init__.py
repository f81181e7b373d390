"""Scoring: the Diarization Error Rate, evaluation and tuning on folders, per-window scoring."""
