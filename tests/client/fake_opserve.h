// An in-memory stand-in for the opserve server, enough to test the client library and the CLI
// without a device: it stores tensors, streams them back in chunks, checks bearer tokens and
// answers Execute with an echo (fake_opserve.cc). It is no reference for op semantics.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "grpcpp/server.h"

namespace opserve::testing {

struct FakeServerOptions {
  std::string address = "127.0.0.1:0";  // port 0: pick a free one
  // Metadata every call must carry, e.g. {"authorization", "Bearer s3cret"}: UNAUTHENTICATED
  // otherwise.
  std::map<std::string, std::string> required_metadata;
  std::map<std::string, int> channel_args;  // e.g. flow-control settings under test
  // Uploads land in buffers freed by earlier overwrites, as a server with a buffer pool would:
  // their pages are already mapped, which isolates the transport from first-touch page faults.
  bool reuse_buffers = false;
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
