#include "server/engine/device.h"

namespace opserve {

absl::StatusOr<std::unique_ptr<Device>> Device::Start(std::unique_ptr<Backend> backend,
                                                      int lanes, int max_queue,
                                                      std::chrono::microseconds poll,
                                                      DeviceWorker::LaneObserver observer,
                                                      int completion_threads, int contexts) {
  auto worker = DeviceWorker::Start(*backend, lanes, max_queue, poll, std::move(observer),
                                    completion_threads, contexts);
  if (!worker.ok()) return worker.status();
  return std::unique_ptr<Device>(new Device(std::move(backend), *std::move(worker)));
}

}  // namespace opserve
