# The two commands of the README: `make demo` and `make test`. Both install what is missing.
# They build in trees of their own, so that none reconfigures another:
#   $(BUILD)       a release build (OPSERVE_TEST_HOOKS=OFF): make, make build
#   $(TEST_BUILD)  the same with the test hooks (OPSERVE_TEST_HOOKS=ON), which some suites
#                  use: make test, make test-build, make gpu-bundle
#   $(DEMO_BUILD)  make demo's: the server and the CLI only, with kernels for this machine's GPUs
#                  alone, or no CUDA backend where no GPU answers (scripts/demo-cmake-flags.sh)
# The kernels are built for every supported GPU (OPSERVE_CUDA_ARCHS in CMakeLists.txt); for one
# architecture only, quicker, as CI does: make test CMAKE_FLAGS=-DOPSERVE_CUDA_ARCHS=90-real
BUILD ?= build
TEST_BUILD ?= $(BUILD)-test
DEMO_BUILD ?= $(BUILD)-demo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test-deps configure build test-configure test-build demo-configure demo-build demo test \
	gpu-bundle clean

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

# CMAKE_FLAGS last: what the caller asks for wins over the machine's choice.
demo-configure:
	cmake -S . -B $(DEMO_BUILD) -G Ninja -DOPSERVE_TEST_HOOKS=OFF $$(./scripts/demo-cmake-flags.sh) $(CMAKE_FLAGS)

demo-build: demo-configure
	ninja -C $(DEMO_BUILD) -j $(JOBS) opserve opserve-cli

demo: deps demo-build
	./scripts/demo.sh $(DEMO_BUILD)

test: test-deps test-build
	cd $(TEST_BUILD) && ctest --output-on-failure --timeout 900 -j 2

# A self-contained bundle for a GPU machine, from the test tree (the GPU suite and opserve-bench's
# --load_variant use the hooks), with a second tree ($(TEST_BUILD)-80v, kernels as compute_80 PTX)
# for the GPU suite's capped mode.
gpu-bundle: deps test-build
	CMAKE_FLAGS="$(CMAKE_FLAGS)" JOBS=$(JOBS) ./scripts/gpu-bundle.sh $(TEST_BUILD)

clean:
	rm -rf $(BUILD) $(TEST_BUILD) $(DEMO_BUILD)
