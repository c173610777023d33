#include "server/rpc/lifted_parse.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <span>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace opserve {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

// Re-encodes a message field by field, lifting the path's bytes: every other field as it came
// (in wire order, so protobuf merges them as it would have), the lifted ones empty, and the
// messages on the path re-encoded the same way with their new lengths.
class Rewriter {
 public:
  Rewriter(CodedInputStream& in, uint64_t total, ReceivePool& pool, uint64_t min_lift,
           std::vector<LiftedEntry>* lifted)
      : in_(in), total_(total), pool_(pool), min_lift_(min_lift), lifted_(lifted) {}

  // The fields up to the stream's current limit (the end at depth 0). `path`: what is left of
  // the lift path at this level; `entry`: the top-level occurrence this level is inside.
  bool Level(std::span<const int> path, CodedOutputStream& out, LiftedEntry* entry, int depth) {
    // CodedInputStream reads a varint of up to 10 bytes and keeps its low bits, where protobuf's
    // parser refuses a tag or a length of more than 5; re-encoded, such a field would parse. So
    // every tag and varint must come in its shortest form, as serializers write them; anything
    // else (and groups) is left to the ordinary parse.
    const auto shortest = [this](int from, uint64_t value) {
      return in_.CurrentPosition() - from == static_cast<int>(CodedOutputStream::VarintSize64(value));
    };
    for (;;) {
      int at = in_.CurrentPosition();
      const uint32_t tag = in_.ReadTag();
      if (tag == 0) return in_.ConsumedEntireMessage();
      if (!shortest(at, tag)) return false;
      out.WriteTag(tag);
      switch (WireFormatLite::GetTagWireType(tag)) {
        case WireFormatLite::WIRETYPE_VARINT: {
          uint64_t v = 0;
          at = in_.CurrentPosition();
          if (!in_.ReadVarint64(&v) || !shortest(at, v)) return false;
          out.WriteVarint64(v);
          continue;
        }
        case WireFormatLite::WIRETYPE_FIXED32: {
          uint32_t v = 0;
          if (!in_.ReadLittleEndian32(&v)) return false;
          out.WriteLittleEndian32(v);
          continue;
        }
        case WireFormatLite::WIRETYPE_FIXED64: {
          uint64_t v = 0;
          if (!in_.ReadLittleEndian64(&v)) return false;
          out.WriteLittleEndian64(v);
          continue;
        }
        case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
          break;
        default:
          return false;
      }
      uint32_t size = 0;
      at = in_.CurrentPosition();
      if (!in_.ReadVarint32(&size) || !shortest(at, size)) return false;
      // A length past the end of the message, or of the message this field is in, is refused
      // before anything is read or mapped for it. (PushLimit would quietly keep the enclosing
      // limit, and the field would parse short where protobuf refuses the bytes.)
      if (size > total_ - static_cast<uint64_t>(in_.CurrentPosition())) return false;
      if (const int left = in_.BytesUntilLimit(); left >= 0 && size > static_cast<uint32_t>(left)) {
        return false;
      }
      const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
      if (path.empty() || number != path[0]) {
        // A large field off the path would be copied twice more here (into `rest`, then by
        // protobuf) than by the ordinary parse: leave such a request to it.
        if (size >= ReceivePool::kMinLiftBytes) return false;
        std::string bytes;
        if (!in_.ReadString(&bytes, static_cast<int>(size))) return false;
        out.WriteVarint32(size);
        out.WriteString(bytes);
        if (depth == 1 && number == 1 && entry != nullptr) entry->key = std::move(bytes);
        continue;
      }
      LiftedEntry* e = depth == 0 ? &lifted_->emplace_back() : entry;
      if (path.size() == 1) {  // the bytes field itself; a later occurrence replaces an earlier
        if (size < min_lift_) {
          std::string bytes;
          if (!in_.ReadString(&bytes, static_cast<int>(size))) return false;
          out.WriteVarint32(size);
          out.WriteString(bytes);
          e->block.Reset();
          continue;
        }
        absl::StatusOr<ReceivePool::Block> b = pool_.Acquire(size);
        if (!b.ok() || !in_.ReadRaw(b->data(), static_cast<int>(size))) return false;
        e->block = *std::move(b);
        out.WriteVarint32(0);
        continue;
      }
      // A message on the path: its fields re-encoded, then its new length.
      const CodedInputStream::Limit limit = in_.PushLimit(static_cast<int>(size));
      std::string inner;
      {
        google::protobuf::io::StringOutputStream sink(&inner);
        CodedOutputStream inner_out(&sink);
        if (!Level(path.subspan(1), inner_out, e, depth + 1)) return false;
      }
      in_.PopLimit(limit);
      out.WriteVarint32(static_cast<uint32_t>(inner.size()));
      out.WriteString(inner);
    }
  }

 private:
  CodedInputStream& in_;
  const uint64_t total_;
  ReceivePool& pool_;
  const uint64_t min_lift_;
  std::vector<LiftedEntry>* const lifted_;
};

}  // namespace

bool ParseLifting(grpc::ByteBuffer* buffer, const LiftPath& path, ReceivePool& pool,
                  google::protobuf::Message* message, std::vector<LiftedEntry>* lifted,
                  uint64_t min_lift_bytes) {
  lifted->clear();
  if (!buffer->Valid() || path.empty()) return false;
  const uint64_t total = buffer->Length();
  // Nothing in it can be lifted: the ordinary parse, which copies less.
  if (total < min_lift_bytes) return false;
  grpc::ProtoBufferReader reader(buffer);
  if (!reader.status().ok()) return false;
  std::string rest;
  {
    CodedInputStream in(&reader);
    google::protobuf::io::StringOutputStream sink(&rest);
    CodedOutputStream out(&sink);
    Rewriter rewriter(in, total, pool, min_lift_bytes, lifted);
    if (!rewriter.Level(path, out, nullptr, 0)) return false;
  }
  if (!message->ParseFromString(rest)) return false;
  if (path.size() > 1) {
    // A map path: keep the entries whose key's last occurrence was lifted (protobuf keeps the
    // last entry of a key), so that LiftedByKey scans at most one entry per lifted tensor rather
    // than one per inline tensor of the request.
    absl::flat_hash_set<std::string> seen;
    std::vector<LiftedEntry> kept;
    for (auto it = lifted->rbegin(); it != lifted->rend(); ++it) {
      if (seen.insert(it->key).second && !it->block.empty()) kept.push_back(std::move(*it));
    }
    std::reverse(kept.begin(), kept.end());
    *lifted = std::move(kept);
  }
  return true;
}

absl::string_view LiftedAt(const std::vector<LiftedEntry>& lifted, int i, const std::string& entry) {
  if (i < static_cast<int>(lifted.size()) && !lifted[i].block.empty()) return lifted[i].block.view();
  return entry;
}

std::optional<absl::string_view> LiftedByKey(const std::vector<LiftedEntry>& lifted,
                                             absl::string_view key) {
  for (auto it = lifted.rbegin(); it != lifted.rend(); ++it) {
    if (it->key != key) continue;
    if (it->block.empty()) return std::nullopt;
    return it->block.view();
  }
  return std::nullopt;
}

}  // namespace opserve
