# The two commands of the README: `make demo` and `make test`. Both install what is missing.
# They build in two trees, so that neither reconfigures the other:
#   $(BUILD)       a release build (OPSERVE_TEST_HOOKS=OFF): make, make build, make demo
#   $(TEST_BUILD)  the same with the test hooks (OPSERVE_TEST_HOOKS=ON), which some suites
#                  use: make test, make test-build, make gpu-bundle
# The kernels are built for every supported GPU (OPSERVE_CUDA_ARCHS in CMakeLists.txt); for one
# architecture only, quicker, as CI does: make test CMAKE_FLAGS=-DOPSERVE_CUDA_ARCHS=90-real
BUILD ?= build
TEST_BUILD ?= $(BUILD)-test
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test-deps configure build test-configure test-build demo test gpu-bundle clean

all: build

deps:
	./scripts/install-deps.sh

test-deps:
	./scripts/install-deps.sh --test

configure:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) -DOPSERVE_TEST_HOOKS=OFF

build: configure
	ninja -C $(BUILD) -j $(JOBS)

test-configure:
	cmake -S . -B $(TEST_BUILD) -G Ninja $(CMAKE_FLAGS) -DOPSERVE_TEST_HOOKS=ON

test-build: test-configure
	ninja -C $(TEST_BUILD) -j $(JOBS)

demo: deps build
	./scripts/demo.sh $(BUILD)

test: test-deps test-build
	cd $(TEST_BUILD) && ctest --output-on-failure --timeout 900 -j 2

# A self-contained bundle for a GPU machine, from the test tree (the GPU suite and opserve-bench's
# --load_variant use the hooks), with a second tree ($(TEST_BUILD)-80v, kernels as compute_80 PTX)
# for the GPU suite's capped mode.
gpu-bundle: deps test-build
	CMAKE_FLAGS="$(CMAKE_FLAGS)" JOBS=$(JOBS) ./scripts/gpu-bundle.sh $(TEST_BUILD)

clean:
	rm -rf $(BUILD) $(TEST_BUILD)
