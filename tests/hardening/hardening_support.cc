#include "tests/hardening/hardening_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

extern char** environ;

namespace opserve::hardening {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

namespace {

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

}  // namespace

std::string OpserveBinary() { return e2e::OpserveBinary(); }
std::string CliBinary() { return EnvOr("OPSERVE_CLI", OPSERVE_CLI_DEFAULT); }
std::string UploadHelperBinary() {
  return EnvOr("HARDENING_UPLOAD_HELPER", HARDENING_UPLOAD_HELPER_DEFAULT);
}

// ---- fixture ----

void HardeningTest::SetUp() {
  std::vector<std::string> flags = {"--host=127.0.0.1", "--port=0", "--metrics_port=0",
                                    "--http_port=-1", "--device=cpu"};
  const std::vector<std::string> extra = ExtraFlags();
  flags.insert(flags.end(), extra.begin(), extra.end());
  auto server = e2e::ServerProcess::Start(OpserveBinary(), flags);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  metrics_port_ = e2e::ParseMetricsPort(server_->Output());
  ASSERT_GT(metrics_port_, 0) << "no metrics port in the output:\n" << server_->Output();
  client_ = NewClient(DefaultClientOptions());
  ASSERT_NE(client_, nullptr);
  stub_ = v1::OpServe::NewStub(
      grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
}

void HardeningTest::TearDown() {
  if (server_) {
    const std::string output = server_->Output();
    EXPECT_TRUE(e2e::NoSanitizerReport(output));
    if (HasFailure()) {
      std::cerr << "---- opserve output ----\n" << output << "------------------------\n";
    }
  }
  stub_.reset();
  client_.reset();
  server_.reset();
}

std::unique_ptr<client::Client> HardeningTest::NewClient(client::ClientOptions options) {
  if (options.target.empty() || options.target == client::ClientOptions().target) {
    options.target = server_->target();
  }
  if (options.timeout == absl::InfiniteDuration()) {
    options.timeout = absl::Seconds(60);  // no call in this suite may hang it
  }
  auto c = client::Client::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

AssertionResult HardeningTest::Serving() {
  // Under ThreadSanitizer, over Debian's uninstrumented gRPC, a health call now and then gets no
  // answer at all while the next one on the same channel is answered at once (seen in CI-like
  // runs of the whole suite, before and after the server changes of the time). A server that is
  // really down fails every try; one lost call is not what these tests are about.
  absl::StatusOr<bool> serving = absl::UnknownError("not asked");
  for (int attempt = 0; attempt < 3; ++attempt) {
    serving = client_->HealthServing({absl::Seconds(5)});
    if (serving.ok() || serving.status().code() != absl::StatusCode::kDeadlineExceeded) break;
    std::cerr << "[ HEALTH   ] a health call got no answer in 5 s; asking again" << std::endl;
  }
  if (!serving.ok()) return AssertionFailure() << "health check failed: " << serving.status();
  if (!*serving) return AssertionFailure() << "health is not SERVING";
  if (!server_->Alive()) return AssertionFailure() << "the server process exited";
  return AssertionSuccess();
}

absl::StatusOr<double> HardeningTest::Metric(const std::string& name,
                                             std::initializer_list<std::string> labels) {
  absl::StatusOr<std::string> text = e2e::HttpGetMetrics(metrics_port_);
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, name) || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    const size_t space = line.rfind(' ');
    const absl::string_view series = line.substr(0, space);
    bool all = true;
    for (const std::string& l : labels) all &= series.find(l) != absl::string_view::npos;
    if (!all) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &value)) {
      return absl::DataLossError(absl::StrCat("unparsable sample: ", line));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat("no sample ", name, " with the labels asked for"));
}

uint64_t HardeningTest::UsedBytes() {
  absl::StatusOr<double> v = Metric("opserve_device_memory_bytes", {"kind=\"used\""});
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? static_cast<uint64_t>(*v) : ~0ull;
}

uint64_t HardeningTest::WaitForUsedBytes(uint64_t bytes, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  uint64_t used = UsedBytes();
  while (used != bytes && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    used = UsedBytes();
  }
  return used;
}

double HardeningTest::Requests(const std::string& rpc, const std::string& code) {
  absl::StatusOr<double> v = Metric(
      "opserve_requests_total", {absl::StrCat("rpc=\"", rpc, "\""), absl::StrCat("code=\"", code, "\"")});
  return v.ok() ? *v : 0;
}

// ---- SlowMatmul ----

absl::StatusOr<SlowMatmul> SlowMatmul::Prepare(client::Client& c, double seconds,
                                               std::mt19937_64& rng) {
  SlowMatmul m;
  m.n_ = 256;
  // Measure, resize towards the rate seen, measure again: the CPU backend's thread count and
  // this shared machine's load both change the rate with the size. Each step changes the size
  // by at most 2x, so one measurement disturbed by a load spike cannot swing it far.
  for (int pass = 0; pass < 6; ++pass) {
    if (auto s = m.Store(c, rng); !s.ok()) return s;
    double took = 0;
    for (int warm = 0; warm < 2; ++warm) {
      absl::StatusOr<v1::ExecuteResponse> r = c.Execute(m.Request());
      if (!r.ok()) return r.status();
      if (!m.Check(*r)) return absl::InternalError("the calibration matmul gave a wrong result");
      took = r->nodes(0).kernel_us() * 1e-6;
      if (took > 0.05) break;  // big enough that warming up does not matter
    }
    m.seconds_ = took;
    if (took > 0.6 * seconds && took < 1.6 * seconds) break;
    if (pass == 5) break;  // keep the size that was stored and measured
    const double flops_per_s = 2.0 * m.n_ * m.n_ * m.n_ / std::max(took, 1e-6);
    const int64_t want = static_cast<int64_t>(std::cbrt(seconds * flops_per_s / 2));
    const int64_t next = std::clamp<int64_t>(std::clamp<int64_t>(want, m.n_ / 2, m.n_ * 2), 64, 2048);
    if (next == m.n_) break;
    m.n_ = next;
  }
  return m;
}

v1::ExecuteRequest SlowMatmul::Request() const {
  v1::ExecuteRequest r;
  AddNode(r, "mm", "matmul", {Stored("slow_a"), Stored("slow_b")});
  AddOutput(r, "mm", true);
  return r;
}

v1::ExecuteRequest SlowMatmul::Chain(int nodes) const {
  v1::ExecuteRequest r;
  for (int i = 0; i < nodes; ++i) {
    AddNode(r, absl::StrCat("m", i), "matmul", {Stored("slow_a"), Stored("slow_b")});
  }
  AddOutput(r, absl::StrCat("m", nodes - 1), true);
  return r;
}

AssertionResult SlowMatmul::Check(const v1::ExecuteResponse& resp) const {
  return e2e::IsExactMatmul(resp, n_, col_sums_);
}

absl::Status SlowMatmul::Store(client::Client& c, std::mt19937_64& rng) {
  absl::StatusOr<std::vector<float>> col_sums =
      e2e::StoreExactMatmulInputs(c, "slow_a", "slow_b", n_, rng);
  if (!col_sums.ok()) return col_sums.status();
  col_sums_ = *std::move(col_sums);
  return absl::OkStatus();
}

// ---- child processes ----

namespace {

absl::StatusOr<std::pair<pid_t, int>> SpawnWithPipe(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", strerror(rc)));
  }
  return std::make_pair(pid, fds[0]);
}

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  CommandResult result;
  auto spawned = SpawnWithPipe(argv);
  if (!spawned.ok()) {
    result.output = std::string(spawned.status().message());
    return result;
  }
  const auto [pid, fd] = *spawned;
  const auto deadline = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      kill(pid, SIGKILL);
      result.output += "\n[killed: timed out]";
      break;
    }
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

absl::StatusOr<std::unique_ptr<Child>> Child::Spawn(const std::vector<std::string>& argv) {
  auto spawned = SpawnWithPipe(argv);
  if (!spawned.ok()) return spawned.status();
  std::unique_ptr<Child> c(new Child());
  c->pid_ = spawned->first;
  c->fd_ = spawned->second;
  return c;
}

Child::~Child() {
  Kill();
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::string> Child::WaitForLine(const std::string& prefix,
                                               std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    for (size_t start = 0, eol; (eol = buffered_.find('\n', start)) != std::string::npos;
         start = eol + 1) {
      if (buffered_.compare(start, prefix.size(), prefix) == 0) {
        std::string line = buffered_.substr(start, eol - start);
        buffered_.erase(0, eol + 1);
        return line;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("no line starting '", prefix,
                                                      "' in time; output so far:\n", buffered_));
    }
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the child exited before printing '", prefix, "'; its output:\n", buffered_));
    }
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

void Child::Kill() {
  if (reaped_ || pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
}

// ---- CertDir ----

absl::StatusOr<std::unique_ptr<CertDir>> CertDir::Create() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "opserve-tls-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  std::unique_ptr<CertDir> d(new CertDir());
  d->dir_ = tmpl;
  // P-256 keys: as good as RSA for these checks and much faster to generate.
  // Leaf certificates carry explicit extensions: a CA flag of false, the key usage of their role
  // and, for the server, the names clients dial (127.0.0.1 and localhost).
  const std::string script = R"(set -e
cd "$1"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() {  # name, subject
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
leaf() {  # name, subject, issuer, extensions
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2"
  printf '%s\n' "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
ca ca "opserve test CA"
ca other_ca "unrelated test CA"
leaf server localhost ca "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
leaf client "tenant-client" ca "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
leaf other_client "intruder" other_ca "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
openssl verify -CAfile ca.pem server.pem client.pem >/dev/null
)";
  CommandResult r = RunCommand({"/bin/sh", "-c", script, "sh", d->dir_});
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("generating certificates with openssl failed (exit ",
                                            r.exit_code, "):\n", r.output));
  }
  return d;
}

CertDir::~CertDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace opserve::hardening
