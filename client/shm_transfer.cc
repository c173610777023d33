// Client::PutTensorShm and GetTensorShm: a tensor's bytes through a POSIX shared-memory object
// instead of the socket, for a server on the same host. The object lives for one call: created
// and mapped here, registered with the server (the Open Inference Protocol's system shared
// memory extension), named in the PutTensor header or the GetTensor request, then unregistered
// and removed, on every path.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/opserve_client.h"
#include "common/status_macros.h"
#include "inference/grpc_service.grpc.pb.h"

namespace opserve::client {
namespace {

// A mapped shm object of `bytes` bytes (at least 1), removed with this object.
class ShmObject {
 public:
  static absl::StatusOr<std::unique_ptr<ShmObject>> Create(uint64_t bytes) {
    static std::atomic<int> counter{0};
    auto shm = std::unique_ptr<ShmObject>(new ShmObject);
    shm->bytes_ = std::max<uint64_t>(bytes, 1);
    // A name this process has not used; a killed client of an earlier process with the same pid
    // may have left one behind (pids wrap), so a name that exists is skipped, never reused.
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
      shm->region_ = absl::StrCat("opserve-client-", getpid(), "-", counter.fetch_add(1));
      shm->key_ = "/" + shm->region_;
      fd = shm_open(shm->key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) return absl::InternalError(absl::StrCat("shm_open ", shm->key_, ": ", std::strerror(errno)));
    shm->created_ = true;
    if (ftruncate(fd, static_cast<off_t>(shm->bytes_)) != 0) {
      const int err = errno;
      close(fd);
      return absl::ResourceExhaustedError(absl::StrCat("ftruncate ", shm->key_, " to ", shm->bytes_,
                                                       " bytes: ", std::strerror(err)));
    }
    void* p = mmap(nullptr, shm->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) return absl::ResourceExhaustedError(absl::StrCat("mmap ", shm->key_, ": ", std::strerror(err)));
    shm->data_ = static_cast<char*>(p);
    return shm;
  }
  ~ShmObject() {
    if (data_ != nullptr) munmap(data_, bytes_);
    if (created_) shm_unlink(key_.c_str());
  }
  char* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  const std::string& key() const { return key_; }
  const std::string& region() const { return region_; }

 private:
  ShmObject() = default;
  std::string region_, key_;
  uint64_t bytes_ = 0;
  char* data_ = nullptr;
  bool created_ = false;
};

}  // namespace

// Registers `shm` under its region name for the duration of `body`.
template <typename Body>
auto WithRegion(const std::shared_ptr<grpc::Channel>& channel,
                const std::function<void(grpc::ClientContext*)>& prepare, const ShmObject& shm,
                Body body) -> decltype(body()) {
  auto inference = inference::GRPCInferenceService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    prepare(&ctx);
    inference::SystemSharedMemoryRegisterRequest req;
    req.set_name(shm.region());
    req.set_key(shm.key());
    req.set_byte_size(shm.bytes());
    inference::SystemSharedMemoryRegisterResponse resp;
    if (grpc::Status s = inference->SystemSharedMemoryRegister(&ctx, req, &resp); !s.ok()) {
      return ToAbslStatus(s);
    }
  }
  auto result = body();
  grpc::ClientContext ctx;
  prepare(&ctx);
  inference::SystemSharedMemoryUnregisterRequest req;
  req.set_name(shm.region());
  inference::SystemSharedMemoryUnregisterResponse resp;
  grpc::Status s = inference->SystemSharedMemoryUnregister(&ctx, req, &resp);
  if (result.ok() && !s.ok()) return ToAbslStatus(s);
  return result;
}

absl::StatusOr<v1::TensorInfo> Client::PutTensorShm(absl::string_view name, const HostTensor& tensor,
                                                    bool overwrite, const CallOptions& call) {
  return PutTensorShm(name, tensor, overwrite, Placement{}, call);
}

absl::StatusOr<v1::TensorInfo> Client::PutTensorShm(absl::string_view name, const HostTensor& tensor,
                                                    bool overwrite, const Placement& placement,
                                                    const CallOptions& call) {
  ASSIGN_OR_RETURN(std::unique_ptr<ShmObject> shm, ShmObject::Create(tensor.data.size()));
  if (!tensor.data.empty()) std::memcpy(shm->data(), tensor.data.data(), tensor.data.size());
  auto prepare = [this, &call](grpc::ClientContext* ctx) { Prepare(ctx, call); };
  return WithRegion(channel_, prepare, *shm, [&]() -> absl::StatusOr<v1::TensorInfo> {
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::PutTensorResponse resp;
    auto writer = stub_->PutTensor(&ctx, &resp);
    v1::PutTensorRequest header;
    v1::PutTensorHeader* h = header.mutable_header();
    h->set_name(std::string(name));
    h->set_dtype(tensor.dtype);
    for (int64_t d : tensor.shape) h->add_shape(d);
    h->set_overwrite(overwrite);
    h->set_device(placement.device);
    h->set_shard(placement.shard);
    h->mutable_shm()->set_region(shm->region());
    h->mutable_shm()->set_byte_size(tensor.data.size());
    writer->Write(header);
    writer->WritesDone();
    if (grpc::Status s = writer->Finish(); !s.ok()) return ToAbslStatus(s);
    return resp.info();
  });
}

absl::StatusOr<HostTensor> Client::GetTensorShm(absl::string_view name, const CallOptions& call) {
  // The size first: the region must hold the tensor.
  ASSIGN_OR_RETURN(std::vector<v1::TensorInfo> tensors, ListTensors(call));
  const v1::TensorInfo* info = nullptr;
  for (const v1::TensorInfo& t : tensors) {
    if (t.name() == name) info = &t;
  }
  if (info == nullptr) return absl::NotFoundError(absl::StrCat("no tensor '", name, "'"));
  ASSIGN_OR_RETURN(std::unique_ptr<ShmObject> shm, ShmObject::Create(info->bytes()));
  auto prepare = [this, &call](grpc::ClientContext* ctx) { Prepare(ctx, call); };
  return WithRegion(channel_, prepare, *shm, [&]() -> absl::StatusOr<HostTensor> {
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::GetTensorRequest req;
    req.set_name(std::string(name));
    req.mutable_shm()->set_region(shm->region());
    req.mutable_shm()->set_byte_size(shm->bytes());
    auto reader = stub_->GetTensor(&ctx, req);
    v1::GetTensorResponse msg;
    HostTensor out;
    bool got_info = false;
    while (reader->Read(&msg)) {
      if (msg.has_info()) {
        got_info = true;
        out.dtype = msg.info().dtype();
        out.shape.assign(msg.info().shape().begin(), msg.info().shape().end());
        out.data.assign(shm->data(), msg.info().bytes());
      }
    }
    if (grpc::Status s = reader->Finish(); !s.ok()) return ToAbslStatus(s);
    if (!got_info) return absl::InternalError("GetTensor answered without its info message");
    return out;
  });
}

}  // namespace opserve::client
