# The two commands of the README: `make demo` and `make test`. Both install what is missing.
# The kernels are built for every supported GPU (OPSERVE_CUDA_ARCHS in CMakeLists.txt); for one
# architecture only, quicker, as CI does: make test CMAKE_FLAGS=-DOPSERVE_CUDA_ARCHS=90-real
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test-deps configure build demo test gpu-bundle clean

all: build

deps:
	./scripts/install-deps.sh

test-deps:
	./scripts/install-deps.sh --test

configure:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: configure
	ninja -C $(BUILD) -j $(JOBS)

demo: deps build
	./scripts/demo.sh $(BUILD)

test: test-deps build
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -j 2

# A self-contained bundle for the lent GPU machine (../shared/GPU.md), with a second tree
# ($(BUILD)-80v, kernels as compute_80 PTX) for the GPU suite's capped mode.
gpu-bundle: deps build
	CMAKE_FLAGS="$(CMAKE_FLAGS)" JOBS=$(JOBS) ./scripts/gpu-bundle.sh $(BUILD)

clean:
	rm -rf $(BUILD)
