// An in-memory stand-in for the opserve server. The client tests run against the real `opserve`
// binary; this fake remains only for what the real server cannot be made to do (client_test.cc
// lists those cases): require the x-opserve-session metadata that only a proxy reads, store
// zero-element tensors, and send malformed GetTensor streams. transfer_bench also uses it, to
// measure the transport alone. It stores tensors, streams them back in chunks, checks required
// metadata and answers Execute with an echo (fake_opserve.cc); it is no reference for op
// semantics.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "grpcpp/server.h"

namespace opserve::testing {

// How GetTensor answers: correctly, or with one of the malformed streams a broken or hostile
// server could send. The client must turn each into an error, never a crash or a wrong tensor.
enum class GetStream {
  kCorrect,
  kChunkBeforeInfo,       // a chunk, then the info
  kMoreThanAnnounced,     // the info, the data, then one byte more
  kFewerThanAnnounced,    // the info, all but the last byte, then OK
  kInconsistentInfo,      // info.bytes disagrees with dtype x shape
  kTwoInfos,              // the info, then a second info
  kHugeAnnounced,         // an info announcing 2^62 bytes, then OK
};

struct FakeServerOptions {
  std::string address = "127.0.0.1:0";  // port 0: pick a free one
  // Metadata every call must carry, e.g. {"authorization", "Bearer s3cret"}: UNAUTHENTICATED
  // otherwise.
  std::map<std::string, std::string> required_metadata;
  std::map<std::string, int> channel_args;  // e.g. flow-control settings under test
  // Uploads land in buffers freed by earlier overwrites, as a server with a buffer pool would:
  // their pages are already mapped, which isolates the transport from first-touch page faults.
  bool reuse_buffers = false;
  GetStream get_stream = GetStream::kCorrect;
};

class FakeServer {
 public:
  static std::unique_ptr<FakeServer> Start(const FakeServerOptions& options);
  ~FakeServer();
  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  struct Service;
  FakeServer() = default;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace opserve::testing
