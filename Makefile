# make demo  - train the example ICNN and its plain twin with DumpHook, then open the viewer
# make test  - run the test suite (TensorFlow 2.15 + estimator)
# make test VENV=.venv-latest REQ=requirements-latest.txt   - the same under the latest TensorFlow
PY ?= python3
VENV ?= .venv
REQ ?= requirements.txt
RUNS ?= runs
PORT ?= 8501
ADDRESS ?= 127.0.0.1
STAMP := $(VENV)/.installed-$(shell sha256sum $(REQ) pyproject.toml | sha256sum | cut -c1-12)

.PHONY: venv test demo demo-train clean-runs

$(STAMP):
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r $(REQ)
	$(VENV)/bin/python -m pip install -q --no-deps -e .
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

test: venv
	$(VENV)/bin/python -m pytest -q tests

demo-train: venv
	$(VENV)/bin/python -m examples.train_demo --runs $(RUNS)
	$(VENV)/bin/python -m inspector info $(RUNS)

demo: demo-train
	@echo "Viewer: http://localhost:$(PORT)  (Ctrl-C to stop)"
	$(VENV)/bin/python -m streamlit run app.py --server.headless true --server.port $(PORT) \
		--server.address $(ADDRESS) -- $(RUNS)

clean-runs:
	rm -rf $(RUNS)
