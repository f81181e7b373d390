# normlab: `make demo` and `make test` each create .venv, install, and run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench bench-diarize model clean system-deps

# Debian packages for the diarization simulation; without them those tests skip.
system-deps:
	@command -v espeak-ng >/dev/null 2>&1 && command -v flite >/dev/null 2>&1 && command -v sox >/dev/null 2>&1 || \
	  (apt-get update -qq && apt-get install -y -qq espeak-ng flite sox) || \
	  echo "warning: could not install espeak-ng, flite and sox (needs root and apt); simulation tests will skip"

# torch==2.13.0 first: it is the CPU build; an unpinned torch would pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check torch==2.13.0
	$(PIP) install -q --disable-pip-version-check -e '.[dev,plot,scale]'
	touch $(STAMP)

install: $(STAMP)

DEMO := report/diarize-demo
demo: system-deps $(STAMP)
	$(VENV)/bin/normlab lesson
	$(VENV)/bin/normlab report --quick --out report
	@if command -v espeak-ng >/dev/null 2>&1; then \
	  $(VENV)/bin/normlab diarize simulate --out $(DEMO) --n 3 --split test --seed 7 && \
	  $(VENV)/bin/normlab diarize $(DEMO)/wav/*.wav --out $(DEMO)/rttm && \
	  $(VENV)/bin/normlab diarize score $(DEMO)/ref.rttm $(DEMO)/rttm --collar 0.25; \
	else echo "espeak-ng missing: diarization demo skipped"; fi

test: system-deps $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(VENV)/bin/normlab bench

bench-diarize: system-deps $(STAMP)
	$(PY) benchmarks/diarize_latency.py

# The diarization model shipped in the package: simulate, train, tune on dev, score on test
# (about 30 min on 2 cores; re-running resumes). docs/diarization.md has its numbers.
model: system-deps $(STAMP)
	$(VENV)/bin/normlab diarize recipe --out recipe
	cp recipe/model.pt src/normlab/diarization/assets/eend_pre_ln.pt
	cp recipe/results.json src/normlab/diarization/assets/eend_pre_ln.json

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
