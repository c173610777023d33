#include "server/rpc/receive_pool.h"

#include <sys/mman.h>

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace opserve {
namespace {

// Mappings are whole 2 MiB pages, so the kernel can back them with huge pages (fewer faults on
// the first fill), and a block freed by one request fits the next of about the same size.
constexpr uint64_t kGranule = 2 << 20;

}  // namespace

std::shared_ptr<ReceivePool> ReceivePool::Create(Backend* backend, uint64_t max_cached_bytes) {
  return std::shared_ptr<ReceivePool>(new ReceivePool(backend, max_cached_bytes));
}

ReceivePool::~ReceivePool() {
  // Every block holds the pool, so none is in use here.
  for (const Mapping& m : idle_) Unmap(m);
}

ReceivePool::Block& ReceivePool::Block::operator=(Block&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::move(other.pool_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void ReceivePool::Block::Reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Release(data_);
  data_ = nullptr;
  bytes_ = 0;
  pool_.reset();
}

absl::StatusOr<ReceivePool::Block> ReceivePool::Acquire(uint64_t bytes) {
  const uint64_t want = std::max<uint64_t>(kGranule, (bytes + kGranule - 1) / kGranule * kGranule);
  Block b;
  b.pool_ = shared_from_this();
  b.bytes_ = bytes;
  {
    // The smallest idle block that fits and wastes at most half of itself.
    std::lock_guard<std::mutex> lock(mu_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->bytes >= want && it->bytes <= 2 * want && (best == idle_.end() || it->bytes < best->bytes)) {
        best = it;
      }
    }
    if (best != idle_.end()) {
      b.data_ = best->data;
      cached_ -= best->bytes;
      in_use_bytes_ += best->bytes;
      in_use_.push_back(*best);
      idle_.erase(best);
      Notify();
      return b;
    }
  }
  void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    b.pool_.reset();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", want, " bytes of host memory to receive a request field into"));
  }
  (void)madvise(p, want, MADV_HUGEPAGE);
  Mapping m{static_cast<char*>(p), want, false};
  // Registration is an optimisation: a block the device cannot pin still receives the bytes,
  // and the upload from it runs at pageable speed.
  if (backend_ != nullptr) m.registered = backend_->RegisterHostMemory(p, want).ok();
  b.data_ = m.data;
  std::lock_guard<std::mutex> lock(mu_);
  in_use_.push_back(m);
  in_use_bytes_ += m.bytes;
  Notify();
  return b;
}

void ReceivePool::Release(char* data) {
  std::vector<Mapping> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(in_use_.begin(), in_use_.end(), [&](const Mapping& m) { return m.data == data; });
    if (it == in_use_.end()) return;  // not ours: cannot happen, and unmapping it would be worse
    Mapping m = *it;
    in_use_.erase(it);
    in_use_bytes_ -= m.bytes;
    idle_.push_back(m);
    cached_ += m.bytes;
    while (cached_ > max_cached_bytes_ && !idle_.empty()) {
      cached_ -= idle_.front().bytes;
      drop.push_back(idle_.front());
      idle_.erase(idle_.begin());
    }
    Notify();
  }
  for (const Mapping& m : drop) Unmap(m);
}

void ReceivePool::Notify() {
  if (observer_) observer_(in_use_bytes_, cached_);
}

void ReceivePool::Unmap(const Mapping& m) {
  if (m.registered) backend_->UnregisterHostMemory(m.data);
  munmap(m.data, m.bytes);
}

size_t ReceivePool::blocks_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_.size();
}

uint64_t ReceivePool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

bool ParseLifting(grpc::ByteBuffer* buffer, int field, ReceivePool& pool,
                  google::protobuf::Message* message, std::vector<ReceivePool::Block>* lifted,
                  uint64_t min_lift_bytes) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  lifted->clear();
  if (!buffer->Valid()) return false;
  const uint64_t total = buffer->Length();
  grpc::ProtoBufferReader reader(buffer);
  if (!reader.status().ok()) return false;
  // The rest of the message, re-encoded field by field: every other field as it came, and the
  // lifted entries as empty ones. Fields in wire order, so protobuf merges them as it would have.
  std::string rest;
  {
    google::protobuf::io::CodedInputStream in(&reader);
    google::protobuf::io::StringOutputStream sink(&rest);
    google::protobuf::io::CodedOutputStream out(&sink);
    // CodedInputStream reads a varint of up to 10 bytes and keeps its low bits, where protobuf's
    // parser refuses a tag or a length of more than 5; re-encoded, such a field would parse. So
    // every top-level tag and varint must come in its shortest form, as serializers write them;
    // anything else (and groups) is left to the ordinary parse, which decides as protobuf does.
    const auto shortest = [&in](int from, uint64_t value) {
      return in.CurrentPosition() - from == static_cast<int>(CodedOutputStream::VarintSize64(value));
    };
    for (;;) {
      int at = in.CurrentPosition();
      const uint32_t tag = in.ReadTag();
      if (tag == 0) {
        if (!in.ConsumedEntireMessage()) return false;
        break;
      }
      if (!shortest(at, tag)) return false;
      out.WriteTag(tag);
      switch (WireFormatLite::GetTagWireType(tag)) {
        case WireFormatLite::WIRETYPE_VARINT: {
          uint64_t v = 0;
          at = in.CurrentPosition();
          if (!in.ReadVarint64(&v) || !shortest(at, v)) return false;
          out.WriteVarint64(v);
          continue;
        }
        case WireFormatLite::WIRETYPE_FIXED32: {
          uint32_t v = 0;
          if (!in.ReadLittleEndian32(&v)) return false;
          out.WriteLittleEndian32(v);
          continue;
        }
        case WireFormatLite::WIRETYPE_FIXED64: {
          uint64_t v = 0;
          if (!in.ReadLittleEndian64(&v)) return false;
          out.WriteLittleEndian64(v);
          continue;
        }
        case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
          break;
        default:
          return false;
      }
      uint32_t size = 0;
      at = in.CurrentPosition();
      if (!in.ReadVarint32(&size) || !shortest(at, size)) return false;
      // A length past the end of the message is refused before anything is mapped for it.
      if (size > total - static_cast<uint64_t>(in.CurrentPosition())) return false;
      const bool ours = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag)) == field;
      if (!ours || size < min_lift_bytes) {
        std::string bytes;
        if (!in.ReadString(&bytes, static_cast<int>(size))) return false;
        out.WriteVarint32(size);
        out.WriteString(bytes);
        if (ours) lifted->emplace_back();
        continue;
      }
      absl::StatusOr<ReceivePool::Block> b = pool.Acquire(size);
      if (!b.ok() || !in.ReadRaw(b->data(), static_cast<int>(size))) return false;
      lifted->push_back(*std::move(b));
      out.WriteVarint32(0);
    }
  }
  return message->ParseFromString(rest);
}

}  // namespace opserve
