// The RPC names the edge gives the metrics at start-up (server_core.h): every method of
// opserve.v1.OpServe and of the Open Inference Protocol, as the proto files declare them, each
// once; and the RPCs that queue, which are among them.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "inference/grpc_service.pb.h"
#include "opserve/v1/opserve.pb.h"
#include "server/rpc/replica_identity.h"
#include "server/rpc/server_core.h"

namespace opserve {
namespace {

TEST(ServerCoreTest, MetricRpcNamesAreEveryMethodOfBothServices) {
  const std::vector<std::string> names = MetricRpcNames();
  const std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size()) << "a name twice";
  size_t methods = 0;
  for (const google::protobuf::ServiceDescriptor* service :
       {v1::ExecuteRequest::descriptor()->file()->FindServiceByName("OpServe"),
        inference::ModelInferRequest::descriptor()->file()->FindServiceByName(
            "GRPCInferenceService")}) {
    ASSERT_NE(service, nullptr);
    ASSERT_GT(service->method_count(), 0);
    for (int i = 0; i < service->method_count(); ++i) {
      EXPECT_EQ(unique.count(service->method(i)->name()), 1u) << service->method(i)->name();
    }
    methods += service->method_count();
  }
  EXPECT_EQ(names.size(), methods);
  for (const std::string& queued : QueuedRpcNames()) EXPECT_EQ(unique.count(queued), 1u) << queued;
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
