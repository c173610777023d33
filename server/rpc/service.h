// The gRPC handlers of opserve.v1.OpServe (callback API). Handlers are thin: they convert the
// request (convert.h), plan it on the gRPC thread, and hand device work to the device, whose
// worker finishes the call; the result is converted back into the response.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "opserve/v1/opserve.grpc.pb.h"
#include "server/engine/device.h"
#include "server/rpc/graph_batcher.h"
#include "server/rpc/graph_store.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/parsed_service.h"
#include "server/rpc/shared_memory.h"
#include "server/engine/metrics.h"
#include "server/engine/plan.h"
#include "server/rpc/request_parsing.h"
#include "server/rpc/request_trace.h"
#include "server/engine/tensor_store.h"
#include "server/rpc/transfer_pool.h"

namespace opserve {

struct ServiceOptions {
  Limits limits;
  uint32_t default_chunk_bytes = 1 << 20;
  // Bearer token -> tenant (the tensor namespace). Empty: no authentication, one namespace.
  std::map<std::string, std::string> tokens;
#if OPSERVE_TEST_HOOKS
  // The test hooks (--test_* flags), which only test builds have.
  // "op/algorithm" whose every run fails as a faulty kernel would.
  std::string fail_algorithm;
  // Answer Execute and ModelInfer without running the graph, with zeros of the
  // outputs' sizes: "handler" on the gRPC thread after planning, "launch" on a lane's launch
  // thread (its slot freed after the reply), "lane" through a lane's launch and completion
  // threads. Graphs that store an output or write one to a shared-memory region run as usual.
  // It tells what gRPC and the hand-offs cost from what the device does (opserve-bench
  // --load_variant; PERFORMANCE.md).
  std::string reply_without_device;
#endif
  // Where graph calls record their timelines (--trace_requests); nullptr: nowhere.
  RequestTrace* trace = nullptr;
  // Most graph calls that run as one plan (--max_batch_size; graph_batcher.h); 1: none.
  int max_batch_size = 1;
};

class OpServeService final
    : public ParsedService<OpServeService, v1::OpServe::CallbackService> {
 public:
  OpServeService(Device& device, TensorStore& store, Metrics* metrics, ServiceOptions options)
      : ParsedService("opserve.v1.OpServe"),
        device_(device),
        store_(store),
        metrics_(metrics),
        options_(options),
        batcher_(options_.max_batch_size),
        receive_pool_(ReceivePool::Create(&device.backend(), ReceiveCacheBytes(options_.limits))) {
    if (metrics_ != nullptr) {
      receive_pool_->SetObserver([m = metrics_](uint64_t in_use, uint64_t idle) {
        m->SetReceiveBuffers(in_use, idle);
      });
    }
    ParseRequestsInHandlers();
  }

  // PutTensor reads its messages as ParsedStreamMessage (see ParseRequestsInHandlers), so its
  // reactor is not the generated PutTensor(ctx, resp) override, which nothing calls.
  grpc::ServerReadReactor<ParsedStreamMessage<v1::PutTensorRequest>>* StartPutTensor(
      grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp);
  grpc::ServerWriteReactor<v1::GetTensorResponse>* GetTensor(
      grpc::CallbackServerContext* ctx, const v1::GetTensorRequest* req) override;
  grpc::ServerUnaryReactor* DeleteTensor(grpc::CallbackServerContext* ctx,
                                         const v1::DeleteTensorRequest* req,
                                         v1::DeleteTensorResponse* resp) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const v1::ListTensorsRequest* req,
                                        v1::ListTensorsResponse* resp) override;
  // Not the generated override: its request carries the inline tensors' data received into the
  // receive pool (ParseUnaryLifting).
  grpc::ServerUnaryReactor* Execute(grpc::CallbackServerContext* ctx,
                                    const ParsedRequest<v1::ExecuteRequest>* req,
                                    v1::ExecuteResponse* resp);
  grpc::ServerUnaryReactor* ListOps(grpc::CallbackServerContext* ctx,
                                    const v1::ListOpsRequest* req,
                                    v1::ListOpsResponse* resp) override;
  grpc::ServerUnaryReactor* SaveGraph(grpc::CallbackServerContext* ctx,
                                      const v1::SaveGraphRequest* req,
                                      v1::SaveGraphResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteGraph(grpc::CallbackServerContext* ctx,
                                        const v1::DeleteGraphRequest* req,
                                        v1::DeleteGraphResponse* resp) override;
  grpc::ServerUnaryReactor* ListGraphs(grpc::CallbackServerContext* ctx,
                                       const v1::ListGraphsRequest* req,
                                       v1::ListGraphsResponse* resp) override;

  // Called when a request saw the backend fail for good (a sticky device error).
  // Set once, before the server starts; may be called again and again.
  void set_on_unhealthy(std::function<void()> f) { on_unhealthy_ = std::move(f); }
  void ReportUnhealthy() {
    if (on_unhealthy_) on_unhealthy_();
  }

  // Shared by the handlers and the transfer reactors.
  Device& device() { return device_; }
  Backend& backend() { return device_.backend(); }
  TensorStore& store() { return store_; }
  GraphStore& graphs() { return graphs_; }
  // Registered through the Open Inference Protocol; PutTensor, GetTensor and Execute name them.
  SharedMemoryRegistry& regions() { return regions_; }
  Metrics* metrics() { return metrics_; }
  GraphBatcher& batcher() { return batcher_; }
  TransferPool& transfers() { return transfers_; }
  // Where Execute and ModelInfer receive their large tensor bytes (receive_pool.h).
  const std::shared_ptr<ReceivePool>& receive_pool() { return receive_pool_; }
  const ServiceOptions& options() const { return options_; }
  void RecordRpc(absl::string_view rpc, const absl::Status& s,
                 std::chrono::steady_clock::time_point start);
  void UpdateStoreGauges();
  // Calls handed to a handler and not yet done (OnDone), for the drain on SIGTERM.
  void CallStarted() { active_calls_.fetch_add(1, std::memory_order_relaxed); }
  void CallDone() { active_calls_.fetch_sub(1, std::memory_order_relaxed); }
  int active_calls() const { return active_calls_.load(std::memory_order_relaxed); }
  // The caller's tenant from its bearer token; UNAUTHENTICATED when tokens are
  // configured and the call has none or a wrong one.
  absl::StatusOr<std::string> Authenticate(grpc::CallbackServerContext* ctx) const;

  // The answer to a request of `rpc` that did not parse (`parse`), counted like any other: a
  // caller without a valid token learns nothing more than UNAUTHENTICATED.
  absl::Status RefuseUnparsed(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                              const absl::Status& parse) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> tenant = Authenticate(ctx);
    const absl::Status s =
        tenant.ok() ? absl::Status(parse.code(), absl::StrCat(rpc, ": ", parse.message()))
                : tenant.status();
    RecordRpc(rpc, s, start);
    return s;
  }

 private:
  // gRPC's generated handlers end a call whose request does not parse with a bare UNIMPLEMENTED
  // and never call the service (server/request_parsing.h says when and why). These replace them,
  // method by method (parsed_service.h). Runs once, in the constructor.
  void ParseRequestsInHandlers() {
    ParseUnary("DeleteTensor", &OpServeService::DeleteTensor);
    ParseUnary("ListTensors", &OpServeService::ListTensors);
    ParseUnaryLifting("Execute",
                      {v1::ExecuteRequest::kInlineTensorsFieldNumber, /*the map entry's value*/ 2,
                       v1::Tensor::kDataFieldNumber},
                      receive_pool_, &OpServeService::Execute);
    ParseUnary("ListOps", &OpServeService::ListOps);
    ParseUnary("SaveGraph", &OpServeService::SaveGraph);
    ParseUnary("DeleteGraph", &OpServeService::DeleteGraph);
    ParseUnary("ListGraphs", &OpServeService::ListGraphs);
    using GetRequest = ParsedRequest<v1::GetTensorRequest>;
    MarkMethodCallback(
        MethodIndex("GetTensor"),
        new grpc::internal::CallbackServerStreamingHandler<GetRequest, v1::GetTensorResponse>(
            [this](grpc::CallbackServerContext* ctx,
                   const GetRequest* req) -> grpc::ServerWriteReactor<v1::GetTensorResponse>* {
              TakeOverParsed(req);
              if (req->status.ok()) return GetTensor(ctx, &req->message);
              return new FinishedWriteReactor<v1::GetTensorResponse>(
                  ToGrpcStatus(RefuseUnparsed(ctx, "GetTensor", req->status)));
            }));
    // Each message of the stream is checked by the reactor as it arrives.
    MarkMethodCallback(
        MethodIndex("PutTensor"),
        new grpc::internal::CallbackClientStreamingHandler<
            ParsedStreamMessage<v1::PutTensorRequest>, v1::PutTensorResponse>(
            [this](grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp) {
              return StartPutTensor(ctx, resp);
            }));
  }

  Device& device_;
  TensorStore& store_;
  GraphStore graphs_;
  SharedMemoryRegistry regions_;
  Metrics* metrics_;
  const ServiceOptions options_;
  GraphBatcher batcher_;
  std::function<void()> on_unhealthy_;
  std::atomic<int> active_calls_{0};
  // Idle receive blocks kept for the next request: two of the largest message, so that a
  // client sending one after another never maps memory again; at least 64 MiB.
  static uint64_t ReceiveCacheBytes(const Limits& limits) {
    return std::max<uint64_t>(64 << 20, 2 * limits.max_message_bytes);
  }
  const std::shared_ptr<ReceivePool> receive_pool_;
  // Steps of PutTensor / GetTensor that may wait on the device. Destroyed with the service,
  // after the gRPC server has finished every call: in gRPC 1.51, Server::Shutdown returns only
  // once every callback call's OnDone has run (each call holds a server reference until then),
  // so no reactor and no posted step outlives it.
  static constexpr int kTransferThreads = 4;
  TransferPool transfers_{kTransferThreads};
};

// OK while the call is alive; DEADLINE_EXCEEDED once its deadline passed, CANCELLED once the
// client cancelled it. Checked before work starts, between nodes, and at each commit.
absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx);

}  // namespace opserve
