# The pipelines users copy. Each target builds (and then reuses) a local virtual environment by itself.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    ?= out
JOBS   ?= 2

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# A real end-to-end run on a bundled model: build it, then show what was made.
demo: $(STAMP)
	$(BIN)/python -m npuc.models.make_models $(OUT)/models
	$(BIN)/npuc inspect $(OUT)/models/tinycnn.onnx
	$(BIN)/npuc run $(OUT)/models/tinycnn.onnx --random-input -o $(OUT)/tinycnn_out.npz

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -q

bench: $(STAMP)
	$(BIN)/python bench/frontend.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(OUT)
