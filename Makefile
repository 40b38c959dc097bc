# make demo  - train the example ICNN and its plain twin with DumpHook, then open the viewer
# make demo-keras - the same with model.fit + InspectCallback on the latest TensorFlow (Keras 3; .venv-latest)
# make test  - the fast tier of the test suite (TensorFlow 2.15 + estimator; tests/tiers.py lists the slow tier)
# make test-all - every test; make test-slow - the slow tier only
# make test VENV=.venv-latest REQ=requirements-latest.txt   - the same under the latest TensorFlow
# make lint  - ruff over the tree, mypy over inspector/ (tools pinned in requirements-lint.txt)
# make screenshots - every viewer page in headless Chromium, saved as docs/images/viewer-<page>.png (docs/viewer/)
# make docs  - the user guide and API reference as a site in site/ (mkdocs --strict; pins in requirements-docs.txt)
PY ?= python3
VENV ?= .venv
REQ ?= requirements.txt
RUNS ?= runs
PORT ?= 8501
ADDRESS ?= 127.0.0.1
STAMP := $(VENV)/.installed-$(shell sha256sum $(REQ) pyproject.toml | sha256sum | cut -c1-12)
# the lint tools live in their own small venv: no TensorFlow, rebuilt only when their pins change
LINT_VENV ?= .venv-lint
LINT_STAMP := $(LINT_VENV)/.installed-$(shell sha256sum requirements-lint.txt | cut -c1-12)

.PHONY: venv test test-slow test-all kernel lint screenshots demo demo-train demo-keras demo-keras-train clean-runs
KERAS_VENV ?= .venv-latest
KERAS_REQ ?= requirements-latest.txt
KERAS_RUNS ?= runs-keras

$(STAMP):
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r $(REQ)
	$(VENV)/bin/python -m pip install -q --no-deps -e .
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

# the statistics kernel is compiled ahead of time (not in the first test's hook); without a
# compiler the tests that need it skip, so its failure is only reported here
kernel: venv
	$(VENV)/bin/python -m hooks.native build || echo "warning: the statistics kernel was not built (see above)"

# JOBS test processes (pytest-xdist), each test file in one of them (its module fixtures built once)
JOBS ?= 2
PYTEST = $(VENV)/bin/python -m pytest -q -n $(JOBS) --dist loadfile

test: kernel
	$(PYTEST) -m "not slow" tests $(PYTEST_ARGS)

test-slow: kernel
	$(PYTEST) -m slow tests $(PYTEST_ARGS)

test-all: kernel
	$(PYTEST) tests $(PYTEST_ARGS)

# the browser test that renders every page writes each page's screenshot where TF_INSPECTOR_SHOTS says
screenshots: venv
	TF_INSPECTOR_SHOTS=docs/images $(VENV)/bin/python -m pytest -q tests/test_browser.py -k test_page_renders_in_chromium

$(LINT_STAMP): requirements-lint.txt
	@test -x $(LINT_VENV)/bin/python || $(PY) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q -r requirements-lint.txt
	@rm -f $(LINT_VENV)/.installed-* && touch $(LINT_STAMP)

lint: $(LINT_STAMP)
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/mypy

demo-train: venv
	$(VENV)/bin/python -m examples.train_demo --runs $(RUNS)
	$(VENV)/bin/python -m inspector info $(RUNS)

demo: demo-train
	@echo "Viewer: http://localhost:$(PORT)  (Ctrl-C to stop)"
	$(VENV)/bin/python -m viewer.start run app.py --server.headless true --browser.gatherUsageStats false --server.port $(PORT) \
		--server.address $(ADDRESS) -- $(RUNS)

# the Keras path: its own venv (the latest TensorFlow), built by the same rule
demo-keras-train:
	$(MAKE) venv VENV=$(KERAS_VENV) REQ=$(KERAS_REQ)
	$(KERAS_VENV)/bin/python -m examples.train_keras --runs $(KERAS_RUNS)
	$(KERAS_VENV)/bin/python -m inspector info $(KERAS_RUNS)

demo-keras: demo-keras-train
	@echo "Viewer: http://localhost:$(PORT)  (Ctrl-C to stop)"
	$(KERAS_VENV)/bin/python -m viewer.start run app.py --server.headless true --browser.gatherUsageStats false --server.port $(PORT) \
		--server.address $(ADDRESS) -- $(KERAS_RUNS)

clean-runs:
	rm -rf $(RUNS) $(KERAS_RUNS)

# the documentation site: mkdocs in its own small venv (no TensorFlow: the API reference reads the
# sources statically), rebuilt only when its pins change; --strict fails on a broken link or reference
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed-$(shell sha256sum requirements-docs.txt | cut -c1-12)

$(DOCS_STAMP): requirements-docs.txt
	@test -x $(DOCS_VENV)/bin/python || $(PY) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q -r requirements-docs.txt
	@rm -f $(DOCS_VENV)/.installed-* && touch $(DOCS_STAMP)

.PHONY: docs
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict
