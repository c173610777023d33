// The RPC names the edge gives the metrics at start-up (server_core.h): every method of
// opserve.v1.OpServe, as the proto file declares them, and ModelInfer, each once.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "opserve/v1/opserve.pb.h"
#include "server/rpc/replica_identity.h"
#include "server/rpc/server_core.h"

namespace opserve {
namespace {

TEST(ServerCoreTest, MetricRpcNamesAreEveryOpServeMethodAndModelInfer) {
  const std::vector<std::string> names = MetricRpcNames();
  const std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size()) << "a name twice";
  const google::protobuf::ServiceDescriptor* service =
      v1::ExecuteRequest::descriptor()->file()->FindServiceByName("OpServe");
  ASSERT_NE(service, nullptr);
  ASSERT_GT(service->method_count(), 0);
  for (int i = 0; i < service->method_count(); ++i) {
    EXPECT_EQ(unique.count(service->method(i)->name()), 1u) << service->method(i)->name();
  }
  EXPECT_EQ(unique.count("ModelInfer"), 1u);
  EXPECT_EQ(names.size(), static_cast<size_t>(service->method_count()) + 1);
}

// The record of sessions that stored on a replica keeps the most recently seen ones: a lookup
// counts as seen, and the oldest goes when the set is full.
TEST(ServerCoreTest, SessionRecordDropsTheLeastRecentlySeen) {
  SessionRecord record(/*capacity=*/2);
  record.Add("a");
  record.Add("b");
  EXPECT_TRUE(record.Contains("a"));  // now the most recent
  record.Add("c");
  EXPECT_EQ(record.size(), 2u);
  EXPECT_TRUE(record.Contains("a"));
  EXPECT_FALSE(record.Contains("b"));
  EXPECT_TRUE(record.Contains("c"));
  record.Add("c");  // again: no duplicate
  EXPECT_EQ(record.size(), 2u);
  EXPECT_FALSE(record.Contains(""));
}

}  // namespace
}  // namespace opserve
