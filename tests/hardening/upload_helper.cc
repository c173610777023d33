// A client that dies in the middle of a PutTensor: it sends the header and `send_bytes` of the
// tensor's bytes, never half-closes the stream, prints "SENT <n>" and waits to be killed. The
// test SIGKILLs it, so the server sees what a crashed client or a dropped connection looks like
// (the kernel closes the socket), not a polite gRPC cancellation.
//
//   upload_helper TARGET NAME ELEMENTS SEND_BYTES
// ELEMENTS: the FLOAT32 element count in the header; SEND_BYTES <= ELEMENTS * 4.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "opserve/v1/opserve.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: upload_helper TARGET NAME ELEMENTS SEND_BYTES\n");
    return 2;
  }
  const std::string target = argv[1], name = argv[2];
  const int64_t elements = std::atoll(argv[3]);
  const uint64_t send_bytes = std::strtoull(argv[4], nullptr, 10);
  auto stub = opserve::v1::OpServe::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  opserve::v1::PutTensorResponse resp;
  auto writer = stub->PutTensor(&ctx, &resp);
  opserve::v1::PutTensorRequest header;
  header.mutable_header()->set_name(name);
  header.mutable_header()->set_dtype(opserve::v1::FLOAT32);
  header.mutable_header()->add_shape(elements);
  if (!writer->Write(header)) {
    std::printf("FAILED header\n");
    return 1;
  }
  constexpr uint64_t kChunk = 256 << 10;
  uint64_t sent = 0;
  while (sent < send_bytes) {
    const uint64_t n = std::min(kChunk, send_bytes - sent);
    opserve::v1::PutTensorRequest chunk;
    chunk.set_chunk(std::string(n, '\x5a'));
    // A buffered write returns once the message is handed to the transport; the server has it
    // by the time the flow-control window lets the next ones through. The last write is
    // followed by a round trip (below) so the bytes are known to be there.
    if (!writer->Write(chunk)) {
      std::printf("FAILED chunk at %llu\n", static_cast<unsigned long long>(sent));
      return 1;
    }
    sent += n;
  }
  // A unary call on the same channel (and so the same connection) completes only after the
  // server has read everything sent before it on that connection's byte stream.
  grpc::ClientContext list_ctx;
  opserve::v1::ListTensorsResponse list;
  (void)stub->ListTensors(&list_ctx, opserve::v1::ListTensorsRequest(), &list);
  std::printf("SENT %llu\n", static_cast<unsigned long long>(sent));
  std::fflush(stdout);
  for (;;) pause();  // until SIGKILL
}
