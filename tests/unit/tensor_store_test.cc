// The tensor store (named, shared, all-or-nothing inserts), tensor names, the memory budget and
// the budget-charged buffers of the CPU backend.
#include "server/engine/tensor_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/backend.h"
#include "server/engine/cpu_backend.h"

namespace opserve {
namespace {

bool Mentions(const absl::Status& s, absl::string_view fragment) {
  return s.message().find(fragment) != absl::string_view::npos;
}

class TensorStoreTest : public ::testing::Test {
 protected:
  // A tensor whose buffer is charged to the backend's budget.
  StoredTensorPtr Make(const std::string& name, TensorMeta meta) {
    auto buffer = backend_->Allocate(meta.Bytes());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return std::make_shared<StoredTensor>(StoredTensor{name, std::move(meta), *std::move(buffer)});
  }
  StoredTensorPtr Make(const std::string& name, int64_t floats = 4) {
    return Make(name, {DType::kFloat32, {floats}});
  }
  std::vector<std::string> Names() {
    std::vector<std::string> names;
    for (const StoredTensorPtr& t : store_.List()) names.push_back(t->name);
    std::sort(names.begin(), names.end());
    return names;
  }

  std::unique_ptr<Backend> backend_ = MakeCpuBackend(1 << 20);
  TensorStore store_;
};

TEST_F(TensorStoreTest, InsertGetListErase) {
  EXPECT_EQ(store_.size(), 0u);
  EXPECT_TRUE(store_.List().empty());
  StoredTensorPtr a = Make("a", {DType::kInt64, {2, 3}});
  StoredTensorPtr b = Make("b");
  ASSERT_TRUE(store_.InsertAll({a, b}, {false, false}).ok());
  EXPECT_EQ(store_.size(), 2u);
  EXPECT_EQ(Names(), (std::vector<std::string>{"a", "b"}));

  absl::StatusOr<StoredTensorPtr> got = store_.Get("a");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->get(), a.get());
  EXPECT_EQ((*got)->meta, (TensorMeta{DType::kInt64, {2, 3}}));

  absl::StatusOr<StoredTensorPtr> erased = store_.Erase("a");
  ASSERT_TRUE(erased.ok()) << erased.status();
  EXPECT_EQ(erased->get(), a.get());
  EXPECT_EQ(store_.size(), 1u);
  EXPECT_EQ(store_.Get("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Names(), (std::vector<std::string>{"b"}));
}

TEST_F(TensorStoreTest, GetMissingIsNotFoundAndNamesIt) {
  absl::Status s = store_.Get("nobody").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(Mentions(s, "'nobody'")) << s;
}

TEST_F(TensorStoreTest, EraseMissingIsNotFoundAndNamesIt) {
  ASSERT_TRUE(store_.InsertAll({Make("x")}, {false}).ok());
  absl::Status s = store_.Erase("y").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(Mentions(s, "'y'")) << s;
  EXPECT_EQ(store_.size(), 1u);
}

TEST_F(TensorStoreTest, InsertExistingIsAlreadyExistsAndKeepsTheOld) {
  StoredTensorPtr first = Make("x");
  ASSERT_TRUE(store_.InsertAll({first}, {false}).ok());
  absl::Status s = store_.InsertAll({Make("x", 8)}, {false});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_TRUE(Mentions(s, "'x'")) << s;
  EXPECT_EQ(store_.Get("x")->get(), first.get());
  EXPECT_EQ(store_.CheckFree("x", false).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(TensorStoreTest, OverwriteReplaces) {
  ASSERT_TRUE(store_.InsertAll({Make("x")}, {false}).ok());
  StoredTensorPtr second = Make("x", 8);
  ASSERT_TRUE(store_.InsertAll({second}, {true}).ok());
  EXPECT_EQ(store_.Get("x")->get(), second.get());
  EXPECT_EQ(store_.size(), 1u);
  EXPECT_TRUE(store_.CheckFree("x", true).ok());
  EXPECT_TRUE(store_.CheckFree("free", false).ok());
}

TEST_F(TensorStoreTest, InsertAllIsAllOrNothing) {
  StoredTensorPtr taken = Make("taken");
  ASSERT_TRUE(store_.InsertAll({taken}, {false}).ok());
  // The clash comes last: the names before it must not be written either.
  absl::Status s =
      store_.InsertAll({Make("n1"), Make("n2"), Make("taken", 8)}, {false, false, false});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_TRUE(Mentions(s, "'taken'")) << s;
  EXPECT_EQ(Names(), (std::vector<std::string>{"taken"}));
  EXPECT_EQ(store_.Get("taken")->get(), taken.get());
  // Overwrite on one name does not cover another.
  s = store_.InsertAll({Make("taken", 2), Make("n1")}, {true, false});
  EXPECT_TRUE(s.ok()) << s;
  s = store_.InsertAll({Make("n3"), Make("n1", 2)}, {true, false});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(Names(), (std::vector<std::string>{"n1", "taken"}));
}

TEST_F(TensorStoreTest, ConcurrentInsertsOfOneNameExactlyOneWins) {
  constexpr int kThreads = 8;
  std::vector<StoredTensorPtr> candidates;
  for (int i = 0; i < kThreads; ++i) candidates.push_back(Make("contested"));
  std::atomic<int> wins{0}, clashes{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      absl::Status s = store_.InsertAll({candidates[i]}, {false});
      (s.ok() ? wins : clashes).fetch_add(1);
      EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kAlreadyExists) << s;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wins.load(), 1);
  EXPECT_EQ(clashes.load(), kThreads - 1);
  EXPECT_EQ(store_.size(), 1u);
}

TEST_F(TensorStoreTest, ConcurrentDistinctInserts) {
  constexpr int kThreads = 4, kEach = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        auto tensor = std::make_shared<StoredTensor>(
            StoredTensor{absl::StrCat("t", t, "_", i), {DType::kFloat32, {1}}, nullptr});
        EXPECT_TRUE(store_.InsertAll({tensor}, {false}).ok());
        EXPECT_TRUE(store_.Get(tensor->name).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_.size(), static_cast<size_t>(kThreads * kEach));
}

// A reader that holds a tensor keeps its buffer (and its bytes in the budget) alive across a
// delete or an overwrite; the bytes go back when the last holder lets go.
TEST_F(TensorStoreTest, HeldTensorOutlivesEraseAndOverwrite) {
  const uint64_t before = backend_->Memory().used;
  ASSERT_TRUE(store_.InsertAll({Make("x", 1024)}, {false}).ok());
  EXPECT_EQ(backend_->Memory().used, before + 4096);
  StoredTensorPtr held = *store_.Get("x");
  ASSERT_TRUE(store_.Erase("x").ok());
  EXPECT_EQ(backend_->Memory().used, before + 4096);      // still held
  static_cast<float*>(held->buffer->data())[1023] = 1.f;  // and still writable memory
  held.reset();
  EXPECT_EQ(backend_->Memory().used, before);

  ASSERT_TRUE(store_.InsertAll({Make("y", 1024)}, {false}).ok());
  ASSERT_TRUE(store_.InsertAll({Make("y", 512)}, {true}).ok());
  EXPECT_EQ(backend_->Memory().used, before + 2048);  // the replaced one went back
}

TEST(TensorName, Rules) {
  EXPECT_TRUE(CheckTensorName("a", "t").ok());
  EXPECT_TRUE(CheckTensorName("model/layer.0:w_1-b", "t").ok());
  EXPECT_TRUE(CheckTensorName(std::string(256, 'n'), "t").ok());
  for (const std::string& bad :
       {std::string(), std::string(257, 'n'), std::string("a b"), std::string("a\nb"),
        std::string("x'y"), std::string("é"), std::string("a\0b", 3)}) {
    absl::Status s = CheckTensorName(bad, "tensor under test");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_TRUE(Mentions(s, "tensor under test")) << s;
  }
}

// ---- MemoryBudget ----

TEST(MemoryBudget, ReserveAndRelease) {
  MemoryBudget budget(1000);
  EXPECT_EQ(budget.budget(), 1000u);
  EXPECT_EQ(budget.used(), 0u);
  ASSERT_TRUE(budget.Reserve(400).ok());
  ASSERT_TRUE(budget.Reserve(600).ok());  // exactly to the budget
  EXPECT_EQ(budget.used(), 1000u);
  budget.Release(600);
  EXPECT_EQ(budget.used(), 400u);
  budget.Release(400);
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_TRUE(budget.Reserve(0).ok());
}

TEST(MemoryBudget, OverBudgetIsResourceExhaustedAndChargesNothing) {
  MemoryBudget budget(1000);
  ASSERT_TRUE(budget.Reserve(900).ok());
  absl::Status s = budget.Reserve(101);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(Mentions(s, "101")) << s;   // what was asked
  EXPECT_TRUE(Mentions(s, "900")) << s;   // what is in use
  EXPECT_TRUE(Mentions(s, "1000")) << s;  // the budget
  EXPECT_EQ(budget.used(), 900u);
  EXPECT_TRUE(budget.Reserve(100).ok());
}

TEST(MemoryBudget, HugeRequestsDoNotWrapAround) {
  MemoryBudget budget(1000);
  ASSERT_TRUE(budget.Reserve(10).ok());
  for (uint64_t bytes : {std::numeric_limits<uint64_t>::max(),
                         std::numeric_limits<uint64_t>::max() - 5, uint64_t{1} << 63}) {
    EXPECT_EQ(budget.Reserve(bytes).code(), absl::StatusCode::kResourceExhausted) << bytes;
  }
  EXPECT_EQ(budget.used(), 10u);
}

TEST(MemoryBudget, ConcurrentReservesNeverExceedTheBudget) {
  constexpr uint64_t kBudget = 50000;
  MemoryBudget budget(kBudget);
  std::atomic<uint64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (budget.Reserve(1).ok()) granted.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), kBudget);
  EXPECT_EQ(budget.used(), kBudget);
}

// ---- The CPU backend's buffers ----

TEST(CpuBuffers, AllocateChargesAndDestructionReleases) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(10000);
  EXPECT_EQ(backend->Memory().budget, 10000u);
  EXPECT_EQ(backend->Memory().used, 0u);
  absl::StatusOr<BufferPtr> a = backend->Allocate(6000);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->bytes(), 6000u);
  EXPECT_NE((*a)->data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*a)->data()) % 64, 0u);
  EXPECT_EQ(backend->Memory().used, 6000u);

  absl::StatusOr<BufferPtr> b = backend->Allocate(4001);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_EQ(backend->Memory().used, 6000u);  // a failed allocation charges nothing

  absl::StatusOr<BufferPtr> c = backend->Allocate(4000);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(backend->Memory().used, 10000u);

  BufferPtr shared = *a;  // a second holder
  a->reset();
  EXPECT_EQ(backend->Memory().used, 10000u);
  shared.reset();
  EXPECT_EQ(backend->Memory().used, 4000u);
  c->reset();
  EXPECT_EQ(backend->Memory().used, 0u);
}

TEST(CpuBuffers, UploadAndCopyOut) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1 << 20);
  BufferPtr buf = *backend->Allocate(16);
  const char in[] = "0123456789abcdef";
  std::unique_ptr<Uploader> up = backend->NewUploader(buf);
  ASSERT_TRUE(up->Append(in, 16).ok());
  ASSERT_TRUE(up->Finish().ok());
  char out[8] = {};
  ASSERT_TRUE(backend->CopyOut(*buf, 8, out, 8).ok());
  EXPECT_EQ(std::string(out, 8), "89abcdef");
}

TEST(CpuBuffers, UploaderRefusesToOverrun) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1 << 20);
  BufferPtr buf = *backend->Allocate(8);
  std::unique_ptr<Uploader> up = backend->NewUploader(buf);
  const char bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(up->Append(bytes, 5).ok());
  EXPECT_FALSE(up->Append(bytes, 4).ok());
  ASSERT_TRUE(up->Append(bytes + 5, 3).ok());
  ASSERT_TRUE(up->Finish().ok());
  EXPECT_EQ(std::string(static_cast<char*>(buf->data()), 8), std::string(bytes, 8));
}

}  // namespace
}  // namespace opserve
