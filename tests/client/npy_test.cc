// .npy reading and writing: round trips for every dtype and edge shapes, and one test per class
// of malformed file, each checking that the message names the file and what was wrong.
#include "client/npy.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserve::client {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Preamble(int major, uint32_t header_bytes) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const int length_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < length_bytes; ++i) out += static_cast<char>((header_bytes >> (8 * i)) & 0xff);
  return out;
}

// A .npy image with the header text given verbatim (padded with spaces and '\n').
std::string MakeNpy(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict + "          \n";
  return Preamble(major, header.size()) + header + data;
}

HostTensor Iota(v1::DType dtype, std::vector<int64_t> shape) {
  HostTensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  const uint64_t bytes = *ByteSize(dtype, tensor.shape);
  tensor.data.resize(bytes);
  for (uint64_t i = 0; i < bytes; ++i) tensor.data[i] = static_cast<char>(i * 7 + 3);
  return tensor;
}

// A path unique to this test and process: ctest runs tests in parallel, and TempDir() is shared.
std::string TempPath(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string tag = absl::StrCat(info->test_suite_name(), ".", info->name(), ".", getpid(), ".");
  std::replace(tag.begin(), tag.end(), '/', '_');
  return (std::filesystem::path(::testing::TempDir()) / (tag + name)).string();
}

void ExpectInvalid(const std::string& bytes, const std::string& expected_text) {
  absl::StatusOr<HostTensor> parsed = ParseNpy(bytes, "x.npy");
  ASSERT_FALSE(parsed.ok()) << "accepted; expected an error containing: " << expected_text;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              AllOf(HasSubstr("x.npy: "), HasSubstr(expected_text)));
}

class NpyRoundTrip : public ::testing::TestWithParam<std::tuple<v1::DType, std::vector<int64_t>>> {
};

TEST_P(NpyRoundTrip, SerializeAndParse) {
  const auto& [dtype, shape] = GetParam();
  const HostTensor tensor = Iota(dtype, shape);
  absl::StatusOr<std::string> bytes = SerializeNpy(tensor);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<NpyLayout> layout = ParseNpyHeader(*bytes, bytes->size(), "t");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->data_offset % 64, 0u) << "NumPy aligns the data to 64 bytes";
  absl::StatusOr<HostTensor> back = ParseNpy(*bytes, "t");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, dtype);
  EXPECT_EQ(back->shape, shape);
  EXPECT_EQ(back->data, tensor.data);
}

TEST_P(NpyRoundTrip, WriteAndReadFile) {
  const auto& [dtype, shape] = GetParam();
  const HostTensor tensor = Iota(dtype, shape);
  const std::string path = TempPath("round_trip.npy");
  ASSERT_TRUE(WriteNpyFile(path, tensor).ok());
  absl::StatusOr<HostTensor> back = ReadNpyFile(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, dtype);
  EXPECT_EQ(back->shape, shape);
  EXPECT_EQ(back->data, tensor.data);
}

// Rank 0 (a scalar), zero-size dimensions, 1-tuples and ones are all valid NumPy arrays.
INSTANTIATE_TEST_SUITE_P(
    DTypesAndShapes, NpyRoundTrip,
    ::testing::Combine(::testing::Values(v1::FLOAT32, v1::INT32, v1::INT64),
                       ::testing::Values(std::vector<int64_t>{}, std::vector<int64_t>{0},
                                         std::vector<int64_t>{1}, std::vector<int64_t>{5},
                                         std::vector<int64_t>{2, 3}, std::vector<int64_t>{3, 0, 2},
                                         std::vector<int64_t>{1, 1, 1, 1},
                                         std::vector<int64_t>{7, 33, 2})));

TEST(Npy, WritesTheHeaderNumPyWrites) {
  absl::StatusOr<std::string> header = NpyHeader(v1::FLOAT32, {2, 3});
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->size(), 128u);
  EXPECT_EQ(header->substr(0, 10), Preamble(1, 118));
  EXPECT_EQ(header->substr(10, 59), "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(header->back(), '\n');
  EXPECT_THAT(*NpyHeader(v1::INT64, {5}), HasSubstr("'shape': (5,)"));
  EXPECT_THAT(*NpyHeader(v1::INT32, {}), HasSubstr("'descr': '<i4'"));
  EXPECT_THAT(*NpyHeader(v1::INT32, {}), HasSubstr("'shape': ()"));
}

TEST(Npy, AcceptsOtherWritersSpellings) {
  const std::string data(24, '\1');
  // Double quotes, another key order, no trailing comma, Python 2 longs, NumPy's growth padding.
  EXPECT_TRUE(
      ParseNpy(MakeNpy("{\"shape\": (2L, 3L), \"fortran_order\": False, \"descr\": \"<f4\"}", data),
               "t")
          .ok());
  absl::StatusOr<HostTensor> v2 =
      ParseNpy(MakeNpy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", data, 2), "t");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->dtype, v1::INT64);
  EXPECT_EQ(v2->shape, std::vector<int64_t>{3});
}

TEST(NpyMalformed, NotNpy) {
  ExpectInvalid("", "not a .npy file");
  ExpectInvalid("PK\3\4 a zip file, perhaps an .npz", "not a .npy file");
}

TEST(NpyMalformed, TruncatedPreamble) {
  ExpectInvalid(std::string("\x93NUMPY\1\0", 8), "too short for a .npy preamble");
  ExpectInvalid(std::string("\x93NUMPY\2\0\0\0", 10), "too short for a version 2.0 preamble");
}

TEST(NpyMalformed, UnsupportedVersion) {
  ExpectInvalid(Preamble(3, 0), "unsupported .npy version 3.0 (expected 1.0 or 2.0)");
  std::string minor = Preamble(1, 0);
  minor[7] = 1;
  ExpectInvalid(minor, "unsupported .npy version 1.1");
}

TEST(NpyMalformed, HeaderLengthPastTheFile) {
  ExpectInvalid(Preamble(1, 60000) + "{}", "header length 60000 runs past the end of the file");
  ExpectInvalid(Preamble(2, 0xffffffffu) + "{}", "header length 4294967295 exceeds the limit");
}

TEST(NpyMalformed, FortranOrder) {
  ExpectInvalid(
      MakeNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::string(24, '\0')),
      "fortran_order True is not supported");
}

TEST(NpyMalformed, BigEndian) {
  ExpectInvalid(MakeNpy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", "abcd"),
                "big-endian dtype '>f4' is not supported (expected '<f4', '<i4' or '<i8')");
}

TEST(NpyMalformed, OtherDTypes) {
  for (const char* descr : {"<f8", "|u1", "<f2", "<c8", "|b1", "<U3", "|O", "f4"}) {
    ExpectInvalid(
        MakeNpy(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (1,), }",
                "abcdefgh"),
        std::string("unsupported dtype '") + descr + "'");
  }
  ExpectInvalid(
      MakeNpy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", "abcd"),
      "expected a quoted dtype string");
}

TEST(NpyMalformed, TruncatedAndTrailingData) {
  const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  ExpectInvalid(MakeNpy(dict, std::string(23, '\0')),
                "truncated data: int32[2, 3] needs 24 bytes, the file has 23");
  ExpectInvalid(MakeNpy(dict, std::string(25, '\0')), "1 unexpected bytes after the data");
}

TEST(NpyMalformed, AbsurdShapes) {
  auto with_shape = [](const std::string& shape) {
    return MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }", "");
  };
  // Each of these would ask for terabytes, or overflow, if trusted before checking the file.
  ExpectInvalid(with_shape("(1000000000000,)"), "needs 4000000000000 bytes, the file has 0");
  ExpectInvalid(with_shape("(4294967296, 4294967296, 4294967296)"), "more than 2^64 elements");
  ExpectInvalid(with_shape("(4611686018427387904,)"), "more than 2^64 bytes");
  ExpectInvalid(with_shape("(99999999999999999999,)"), "dimension exceeds 2^63-1");
  ExpectInvalid(with_shape("(-1,)"), "negative dimension");
  std::string rank33 = "(";
  for (int i = 0; i < 33; ++i) rank33 += "1, ";
  ExpectInvalid(with_shape(rank33 + ")"), "more than 32 dimensions");
}

TEST(NpyMalformed, BadDict) {
  auto bad = [](const std::string& dict, const std::string& expected) {
    ExpectInvalid(MakeNpy(dict, ""), expected);
  };
  bad("{'descr': '<f4', 'fortran_order': False}", "the header has no 'shape'");
  bad("{'fortran_order': False, 'shape': (0,)}", "the header has no 'descr'");
  bad("{'descr': '<f4', 'shape': (0,)}", "the header has no 'fortran_order'");
  bad("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (0,)}",
      "key 'descr' appears twice");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (0,), 'extra': 1}",
      "unexpected key 'extra'");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (0,)} junk",
      "expected only padding after '}'");
  bad("{'descr' '<f4', 'fortran_order': False, 'shape': (0,)}", "expected ':' after 'descr'");
  bad("{'descr': '<f4', 'fortran_order': false, 'shape': (0,)}", "expected True or False");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': [0]}", "expected a tuple");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (0, x)}", "expected a dimension");
  bad("{'descr': '<f4' 'fortran_order': False, 'shape': (0,)}", "expected ',' or '}'");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (0,)", "expected ',' or '}'");
  bad("{'des\\cr': '<f4'}", "escapes in strings are not supported");
  bad("['descr']", "expected '{'");
  bad(std::string("{'descr': '<f4', \0", 18), "found byte 0x00");
}

TEST(NpyFile, MissingFileNamesThePath) {
  absl::StatusOr<HostTensor> read = ReadNpyFile(TempPath("does_not_exist.npy"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("does_not_exist.npy: cannot open"));
}

TEST(NpyFile, ReadErrorsNameTheFile) {
  const std::string path = TempPath("truncated.npy");
  std::ofstream(path, std::ios::binary)
      << MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", "abc");
  absl::StatusOr<HostTensor> read = ReadNpyFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(read.status().message()),
              AllOf(HasSubstr(path + ": truncated data"), HasSubstr("needs 16 bytes")));
}

TEST(NpyFile, RefusesWhatNpyCannotHold) {
  HostTensor bf16 = Iota(v1::BFLOAT16, {2});
  EXPECT_FALSE(WriteNpyFile(TempPath("bf16.npy"), bf16).ok());
  HostTensor short_data = Iota(v1::FLOAT32, {2});
  short_data.data.pop_back();
  absl::Status written = WriteNpyFile(TempPath("short.npy"), short_data);
  EXPECT_THAT(std::string(written.message()), HasSubstr("needs 8 bytes, the tensor holds 7"));
}

// Every truncation and many single-byte corruptions of a valid file: the parser must answer
// (accept or refuse) without crashing or over-reading; ASan builds make this a real check.
TEST(NpyHostile, TruncationsAndCorruptionsNeverCrash) {
  const std::string valid = *SerializeNpy(Iota(v1::INT32, {3, 5}));
  for (size_t length = 0; length < valid.size(); ++length) {
    EXPECT_FALSE(ParseNpy(valid.substr(0, length), "t").ok()) << length;
  }
  std::mt19937 random(42);
  int accepted = 0;
  for (size_t pos = 0; pos < valid.size(); ++pos) {
    for (int trial = 0; trial < 16; ++trial) {
      std::string corrupt = valid;
      corrupt[pos] = static_cast<char>(random());
      accepted += ParseNpy(corrupt, "t").ok();
    }
  }
  EXPECT_GT(accepted, 0);  // corrupt element bytes are still a valid file
}

}  // namespace
}  // namespace opserve::client
