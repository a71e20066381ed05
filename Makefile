# The pipelines users copy. Each target builds (and then reuses) a local virtual environment by itself.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    ?= out
JOBS   ?= 2

.PHONY: demo test test-fast bench lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# A real end-to-end run on a bundled model: generate it, inspect it, compile it for two targets and run
# each artifact on npuc's simulator from its bytes, next to the float reference.
demo: $(STAMP)
	$(BIN)/python -m npuc.models.make_models $(OUT)/models tinycnn
	$(BIN)/npuc inspect $(OUT)/models/tinycnn.onnx
	$(BIN)/npuc run $(OUT)/models/tinycnn.onnx --random-input -o $(OUT)/tinycnn_float.npz
	$(BIN)/npuc build $(OUT)/models/tinycnn.onnx --target lyngor -o $(OUT)/tinycnn_lyngor
	$(BIN)/npuc run $(OUT)/tinycnn_lyngor --random-input -o $(OUT)/tinycnn_lyngor.npz
	$(BIN)/npuc build $(OUT)/models/tinycnn.onnx --target dmp -o $(OUT)/tinycnn_dmp
	$(BIN)/npuc run $(OUT)/tinycnn_dmp --random-input -o $(OUT)/tinycnn_dmp.npz
	$(BIN)/npuc inspect $(OUT)/tinycnn_dmp
	$(BIN)/npuc build $(OUT)/models/tinycnn.onnx --target cv18xx --chip cv181x --quant bf16 -o $(OUT)/tinycnn.cvimodel
	$(BIN)/npuc run $(OUT)/tinycnn.cvimodel --random-input -o $(OUT)/tinycnn_cv18xx.npz
	$(BIN)/npuc inspect $(OUT)/tinycnn.cvimodel

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -q

# The inner loop: no vendor simulator, no model downloads (make test runs everything).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -q --fast

bench: $(STAMP)
	$(BIN)/python bench/frontend.py
	$(BIN)/python bench/calibrate.py
	$(BIN)/python bench/accuracy.py
	$(BIN)/python bench/cv18xx.py
	$(BIN)/python bench/coverage.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q tests/test_import_graph.py  # the imports run one way: no cycles

clean:
	rm -rf $(VENV) $(OUT)
