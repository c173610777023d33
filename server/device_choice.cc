#include "server/device_choice.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "server/engine/cpu_backend.h"
#if OPSERVE_WITH_CUDA
#include "server/engine/cuda_backend.h"
#endif

namespace opserve {


absl::StatusOr<DeviceFlag> ParseDeviceFlag(const std::string& flag) {
  DeviceFlag f;
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be auto, cpu, cpu:N, cuda or cuda:I[,J...], got '", flag, "'"));
  };
  if (flag == "cpu") {
    f.cpu = true;
  } else if (flag == "auto") {
    f.all_cuda = f.fall_back = true;
  } else if (flag == "cuda") {
    f.all_cuda = true;
  } else if (flag.rfind("cpu:", 0) == 0) {
    int n = 0;
    if (!absl::SimpleAtoi(flag.substr(4), &n) || n < 1 || n > kMaxDevices) return bad();
    f.cpu = true;
    f.cpu_devices = n;
  } else if (flag.rfind("cuda:", 0) == 0) {
    for (absl::string_view part : absl::StrSplit(flag.substr(5), ',')) {
      int i = 0;
      if (!absl::SimpleAtoi(part, &i) || i < 0 || i >= kMaxDevices) return bad();
      if (std::find(f.cuda.begin(), f.cuda.end(), i) != f.cuda.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--device names cuda:", i, " twice"));
      }
      f.cuda.push_back(i);
    }
  } else {
    return bad();
  }
  return f;
}

namespace {

std::vector<std::unique_ptr<Backend>> CpuBackends(const DeviceFlag& f, uint64_t budget) {
  std::vector<std::unique_ptr<Backend>> out;
  if (f.cpu_devices == 0) {
    out.push_back(MakeCpuBackend(budget));
  } else {
    for (int i = 0; i < f.cpu_devices; ++i) {
      out.push_back(MakeCpuBackend(budget, absl::StrCat("cpu:", i), f.cpu_devices));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Backend>>> ChooseBackends(const std::string& device,
                                                                     uint64_t budget,
                                                                     int max_compute_capability,
                                                                     int graph_cache) {
  ASSIGN_OR_RETURN(DeviceFlag f, ParseDeviceFlag(device));
  if (f.cpu) {
    std::cerr << "opserve: backend cpu (--device=" << device << ")" << std::endl;
    return CpuBackends(f, budget);
  }
#if OPSERVE_WITH_CUDA
  absl::Status probe = absl::OkStatus();
  std::vector<int> ordinals = f.cuda;
  if (f.all_cuda) {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (count.ok()) {
      for (int i = 0; i < *count; ++i) ordinals.push_back(i);
    } else {
      probe = count.status();
    }
  }
  std::vector<std::unique_ptr<Backend>> out;
  for (int i : ordinals) {
    if (!probe.ok()) break;
    probe = ProbeCuda(i);
    if (!probe.ok()) break;
    auto backend = MakeCudaBackend(i, budget, max_compute_capability, graph_cache);
    if (!backend.ok()) {
      probe = backend.status();
      break;
    }
    std::cerr << "opserve: backend cuda: " << (*backend)->description() << " (--device=" << device
              << ")" << std::endl;
    out.push_back(*std::move(backend));
  }
  if (probe.ok()) return out;
  if (!f.fall_back) return probe;
  std::cerr << "opserve: backend cpu: no usable GPU (" << probe.message() << ")" << std::endl;
#else
  (void)max_compute_capability;  // only the CUDA backend has a capability to cap
  if (!f.fall_back) {
    return absl::FailedPreconditionError("this opserve was built without CUDA (no nvcc at build time)");
  }
  std::cerr << "opserve: backend cpu: built without CUDA" << std::endl;
#endif
  return CpuBackends(DeviceFlag{.cpu = true}, budget);
}

}  // namespace opserve
