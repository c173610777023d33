// opserve-cli's rendering of what only some servers send: devices that differ in the algorithm
// rows they run (GPUs of several generations in one node), a failed device, and a sharded
// tensor's parts. The CLI end-to-end test (cli_e2e_test.py) runs two identical CPU devices, on
// which these never show.
#include "client/cli/format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserve::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

v1::DeviceInfo Device(const std::string& name, std::vector<std::string> algorithms) {
  v1::DeviceInfo device;
  device.set_name(name);
  device.set_capability("sm_90");
  device.set_serving(true);
  for (std::string& row : algorithms) device.add_algorithms(std::move(row));
  return device;
}

TEST(AlgorithmDevices, NothingWhenEveryDeviceRunsTheSameRows) {
  v1::ListOpsResponse ops;
  *ops.add_devices() = Device("cuda:0", {"matmul/cublas", "sum/tree"});
  *ops.add_devices() = Device("cuda:1", {"sum/tree", "matmul/cublas"});  // order does not count
  EXPECT_TRUE(AlgorithmDevices(ops).empty());
  EXPECT_TRUE(AlgorithmDevices(v1::ListOpsResponse()).empty());
}

TEST(AlgorithmDevices, NamesTheDevicesOfEachRowWhereTheyDiffer) {
  v1::ListOpsResponse ops;
  *ops.add_devices() = Device("cuda:0", {"matmul/cublas", "matmul/wgmma"});
  *ops.add_devices() = Device("cuda:1", {"matmul/cublas"});
  EXPECT_THAT(AlgorithmDevices(ops),
              ElementsAre(Pair("matmul/cublas", ElementsAre("cuda:0", "cuda:1")),
                          Pair("matmul/wgmma", ElementsAre("cuda:0"))));
}

v1::ListOpsResponse MatmulOps() {
  v1::ListOpsResponse ops;
  ops.set_backend("cuda");
  v1::OpInfo* matmul = ops.add_ops();
  matmul->set_name("matmul");
  matmul->set_default_algorithm("cublas");
  matmul->add_algorithms()->set_name("cublas");
  matmul->add_algorithms()->set_name("wgmma");
  return ops;
}

TEST(OpsText, ADevicesColumnOnlyWhereDevicesDiffer) {
  v1::ListOpsResponse ops = MatmulOps();
  *ops.add_devices() = Device("cuda:0", {"matmul/cublas", "matmul/wgmma"});
  *ops.add_devices() = Device("cuda:1", {"matmul/cublas", "matmul/wgmma"});
  std::string text = OpsText(ops);
  EXPECT_THAT(text, HasSubstr("backend cuda, 2 devices\n\ndevice  capability"));
  EXPECT_THAT(text, HasSubstr("op      algorithm          dtypes  deterministic  description\n"));

  ops.mutable_devices(1)->clear_algorithms();
  ops.mutable_devices(1)->add_algorithms("matmul/cublas");
  text = OpsText(ops);
  EXPECT_THAT(text,
              HasSubstr("op      algorithm          dtypes  deterministic  devices        "
                        "description\n"
                        "matmul  (default: cublas)\n"
                        "        cublas                     no             cuda:0,cuda:1\n"
                        "        wgmma                      no             cuda:0\n"));
}

TEST(OpsText, AServerWithoutDevicesKeepsItsOneLine) {
  v1::ListOpsResponse ops = MatmulOps();
  ops.set_device("cuda:0 NVIDIA H100 80GB HBM3 (sm_90)");
  EXPECT_THAT(OpsText(ops),
              HasSubstr("backend cuda, device cuda:0 NVIDIA H100 80GB HBM3 (sm_90)\n\nop "));
}

TEST(DevicesTable, ShowsMemoryAndWhyADeviceIsOut) {
  v1::ListOpsResponse ops;
  v1::DeviceInfo* ok = ops.add_devices();
  *ok = Device("cuda:0", {});
  ok->set_memory_used(3 << 20);
  ok->set_memory_budget(uint64_t{72} << 30);
  ok->set_memory_total(uint64_t{80} << 30);
  ok->set_description("cuda:0 NVIDIA H100 80GB HBM3 (sm_90)");
  v1::DeviceInfo* out = ops.add_devices();
  *out = Device("cuda:1", {});
  out->set_serving(false);
  out->set_error("an illegal memory access was encountered");
  const std::string table = DevicesTable(ops);
  EXPECT_THAT(table, HasSubstr("device  capability"));
  EXPECT_THAT(table, HasSubstr("cuda:0  sm_90       3.00 MiB  72.0 GiB  80.0 GiB  serving"));
  EXPECT_THAT(table, HasSubstr("out: an illegal memory access was encountered"));
}

TEST(ShardLines, OneLinePerShardNoneUnsharded) {
  v1::TensorInfo info;
  EXPECT_EQ(ShardLines(info), "");
  v1::TensorShard* shard = info.add_shards();
  shard->set_device("cpu:0");
  shard->set_row_begin(0);
  shard->set_rows(3);
  shard->set_bytes(36);
  shard = info.add_shards();
  shard->set_device("cpu:1");
  shard->set_row_begin(3);
  shard->set_rows(2);
  shard->set_bytes(24);
  EXPECT_EQ(ShardLines(info),
            "  shard 0: rows [0, 3) on cpu:0, 36 B\n  shard 1: rows [3, 5) on cpu:1, 24 B\n");
  EXPECT_EQ(RowRange(info.shards(1)), "rows [3, 5)");
}

}  // namespace
}  // namespace opserve::cli
