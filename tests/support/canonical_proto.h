// A message's bytes with map entries in key order, for comparing two parses of the same wire
// data: protobuf's default serialization follows each map's hash order, which two equal
// messages need not share. Header-only, for the unit tests and the fuzz targets alike.
#pragma once

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"

namespace opserve::test_support {

inline std::string Canonical(const google::protobuf::Message& m) {
  std::string s;
  {
    google::protobuf::io::StringOutputStream sink(&s);
    google::protobuf::io::CodedOutputStream out(&sink);
    out.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&out);
  }
  return s;
}

}  // namespace opserve::test_support
