"""The networks: EEND segmentation (``eend``), GE2E speaker embeddings (``embed``), Silero VAD (``vad``)."""
