"""Segmentation + embedding + clustering: any number of speakers (pyannote.audio 3.x, EEND-VC).

1. **Local segmentation** (``segment.py``). The EEND model reads short overlapping windows
   (``window`` seconds every ``step``) and gives, per window, the activity of
   its few local speakers (2-4, the model's ``n_speakers``). Frames below
   ``silence_db`` are silence whatever the model says; ``vad`` says what
   Silero VAD (``models/vad.py``) adds: ``"gate"`` (the class's default)
   silences the frames it calls non-speech, ``"off"`` (the shipped model
   file's choice) leaves speech to the model, ``"speech"`` lets it decide alone.
2. **Pieces.** ``speakers="speech"``: the model's speech, any local speaker,
   cut into ``piece``-second pieces whose speaker the embeddings alone decide
   (one speaker at a time). ``speakers="eend"`` (the shipped model file's
   choice): the model's own local speakers, overlap kept. Each speaker
   encoder and mode has its defaults (``MODE_DEFAULTS``) for a model file
   that holds no settings chosen on a dev set.
3. **Embeddings.** For each piece with enough speech, a speaker embedding of
   its frames (in ``eend`` mode, where that local speaker is the only one
   active; all its active frames when those are too few): GE2E
   (``models/embed.py``, the class's default) or CAM++ (``models/campplus.py``,
   the shipped model file's choice).
4. **Clustering.** Average-linkage agglomerative clustering of all those
   embeddings across the recording (``cluster.py``): a tuned cosine-distance
   threshold, or ``num_speakers``, or ``min_speakers``/``max_speakers``.
5. **Stitching** (``stitch.py``). Each piece's probabilities go to its cluster; local
   speakers of one window in the same cluster are merged (maximum); the
   windows covering a frame are averaged per global speaker. As in
   pyannote, the windows' mean count of distinct active speakers says how
   many global speakers talk in each frame, and that many of the likeliest
   are switched on; a median filter, then RTTM turns. Two global speakers
   active on one frame is overlap, kept.

The settings (``config.PipelineConfig``) come from the model file and the
caller's options; ``api.diarize`` and ``api.diarize_files`` are the entry
points (also ``normlab diarize``).

Memory is bounded by the window, not the recording: features, mel frames and
VAD probabilities are computed in blocks, the model sees ``batch`` windows at
a time, and what is kept per recording is small per frame (a 1-hour file
stays well under 2 GB).
"""
