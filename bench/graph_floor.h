// The CUDA floor under the service's target 4 (replay), measured by the bench itself: no server, no gRPC.
// A CUDA graph of the shape the server replays (server/engine/cuda_node_timer.h): a timestamp
// kernel, one kernel per node lasting that node's measured time with a timestamp kernel after
// each but the last, and the output's copy kernel writing the last stamp. Launched one at a time
// with the device idle before each, as one client's requests arrive, and waited for by polling
// its event. Per launch, the host's time from before cudaGraphLaunch to seeing the event, less
// the device's span between the first and the last stamp: what launching and completing a graph
// costs beyond what the nodes' kernel_us add up to, with nothing of opserve's around it.
#pragma once

#include <string>
#include <vector>

namespace opserve::bench {

struct GraphFloor {
  bool ran = false;
  std::string error;
  double seen_p50_us = 0;      // cudaGraphLaunch to the host seeing the end
  double span_p50_us = 0;      // first stamp to last stamp, on the device
  double overhead_p50_us = 0;  // per launch: seen - span
};

// `node_us`: each node's kernel time (spin kernels of those lengths stand in for the kernels).
GraphFloor MeasureGraphFloor(const std::vector<double>& node_us, int launches);

}  // namespace opserve::bench
