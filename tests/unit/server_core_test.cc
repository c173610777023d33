// The RPC names the edge gives the metrics at start-up (server_core.h): every method of
// opserve.v1.OpServe, as the proto file declares them, and ModelInfer, each once.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "opserve/v1/opserve.pb.h"
#include "server/rpc/server_core.h"

namespace opserve {
namespace {

TEST(ServerCoreTest, MetricRpcNamesAreEveryOpServeMethodAndModelInfers) {
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
  EXPECT_EQ(unique.count("ModelStreamInfer"), 1u);
  EXPECT_EQ(names.size(), static_cast<size_t>(service->method_count()) + 2);
}

}  // namespace
}  // namespace opserve
