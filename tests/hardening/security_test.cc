// Security: TLS and mutual TLS with certificates made by openssl at test time, bearer tokens, and
// the tensor namespace of each token's tenant.
#include <grpcpp/client_context.h>

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/hardening/hardening_support.h"

namespace opserve::hardening {
namespace {

using Code = absl::StatusCode;

// One set of certificates per test process, made on first use (only the TLS and token tests pay
// for openssl) and removed at exit.
class Certs {
 public:
  static std::string Path(const std::string& file) {
    static const std::unique_ptr<CertDir>* const kDir = [] {
      auto dir = CertDir::Create();
      EXPECT_TRUE(dir.ok()) << dir.status();
      static std::unique_ptr<CertDir> owned = dir.ok() ? *std::move(dir) : nullptr;
      return &owned;
    }();
    return *kDir ? (*kDir)->Path(file) : "/nonexistent/" + file;
  }
};

client::ClientOptions Tls(const std::string& ca = "ca.pem") {
  client::ClientOptions o;
  o.root_ca_path = Certs::Path(ca);
  o.timeout = absl::Seconds(10);
  return o;
}

client::ClientOptions Mtls(const std::string& cert = "client") {
  client::ClientOptions o = Tls();
  o.client_cert_path = Certs::Path(cert + ".pem");
  o.client_key_path = Certs::Path(cert + ".key");
  return o;
}

client::ClientOptions Plaintext() {
  client::ClientOptions o;
  o.timeout = absl::Seconds(10);
  return o;
}

// A refused connection: gRPC reports a failed handshake as UNAVAILABLE, with no response.
::testing::AssertionResult Refused(client::Client& c) {
  absl::Status health = c.HealthServing().status();
  absl::Status list = c.ListTensors().status();
  if (health.code() != Code::kUnavailable || list.code() != Code::kUnavailable) {
    return ::testing::AssertionFailure()
           << "expected UNAVAILABLE, got health: " << health << "; ListTensors: " << list;
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// TLS: --tls_cert and --tls_key

class TlsTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--tls_cert=" + Certs::Path("server.pem"), "--tls_key=" + Certs::Path("server.key")};
  }
  client::ClientOptions DefaultClientOptions() const override { return Tls(); }
};

TEST_F(TlsTest, ClientTrustingTheCaWorksByIpAndByName) {
  ASSERT_TRUE(Serving());
  const client::HostTensor t = RandomTensor(v1::FLOAT32, {300, 7}, rng_);
  ASSERT_TRUE(client().PutTensor("t", t, false).ok());
  absl::StatusOr<client::HostTensor> back = client().GetTensor("t");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->data == t.data);

  client::ClientOptions by_name = Tls();
  by_name.target = absl::StrCat("localhost:", server().port());
  // "localhost" resolves to ::1 too, where nothing listens, and under the sanitizers the first
  // TLS handshake on 127.0.0.1 can miss the first attempt (TSan CI: UNAVAILABLE once): wait for
  // the channel, within a deadline, since this test is about the name check, not connect timing.
  by_name.wait_for_ready = true;
  by_name.timeout = absl::Seconds(20);
  auto c = NewClient(by_name);
  absl::StatusOr<bool> serving = c->HealthServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  EXPECT_EQ(c->ListTensors()->size(), 1u);
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  EXPECT_TRUE(Refused(*NewClient(Plaintext())));
  v1::ExecuteRequest r;
  AddInline(r, "x", F32({1}, {1.f}));
  AddNode(r, "s", "sum", {Inline("x")});
  AddOutput(r, "s", true);
  EXPECT_EQ(NewClient(Plaintext())->Execute(r).status().code(), Code::kUnavailable);
  EXPECT_TRUE(Serving());
}

TEST_F(TlsTest, ClientThatDoesNotTrustTheServerRefusesIt) {
  EXPECT_TRUE(Refused(*NewClient(Tls("other_ca.pem"))));
  EXPECT_TRUE(Serving());
}

TEST_F(TlsTest, CliHealthOverTls) {
  const CommandResult ok = RunCommand({CliBinary(), "--target", server().target(), "--root_ca",
                                       Certs::Path("ca.pem"), "--timeout", "10", "health"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const CommandResult ls = RunCommand({CliBinary(), "--target", server().target(), "--root_ca",
                                       Certs::Path("ca.pem"), "--timeout", "10", "ls"});
  EXPECT_EQ(ls.exit_code, 0) << ls.output;
  const CommandResult plain = RunCommand(
      {CliBinary(), "--target", server().target(), "--timeout", "5", "health"});
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("UNAVAILABLE"), std::string::npos) << plain.output;
  const CommandResult untrusted =
      RunCommand({CliBinary(), "--target", server().target(), "--root_ca",
                  Certs::Path("other_ca.pem"), "--timeout", "5", "health"});
  EXPECT_NE(untrusted.exit_code, 0) << untrusted.output;
}

// ---------------------------------------------------------------------------------------------
// Mutual TLS: --tls_client_ca

class MtlsTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--tls_cert=" + Certs::Path("server.pem"), "--tls_key=" + Certs::Path("server.key"),
            "--tls_client_ca=" + Certs::Path("ca.pem")};
  }
  client::ClientOptions DefaultClientOptions() const override { return Mtls(); }
};

TEST_F(MtlsTest, ClientWithACertificateFromTheCaWorks) {
  ASSERT_TRUE(Serving());
  ASSERT_TRUE(client().PutTensor("t", RandomTensor(v1::INT64, {5, 5}, rng_), false).ok());
  EXPECT_EQ(client().ListTensors()->size(), 1u);
}

TEST_F(MtlsTest, ClientWithoutACertificateIsRefused) {
  EXPECT_TRUE(Refused(*NewClient(Tls())));
  EXPECT_TRUE(Serving());
}

TEST_F(MtlsTest, ClientWithACertificateFromAnotherCaIsRefused) {
  EXPECT_TRUE(Refused(*NewClient(Mtls("other_client"))));
  EXPECT_TRUE(Serving());
}

TEST_F(MtlsTest, PlaintextClientIsRefused) {
  EXPECT_TRUE(Refused(*NewClient(Plaintext())));
  EXPECT_TRUE(Serving());
}

TEST_F(MtlsTest, CliHealthOverMutualTls) {
  const CommandResult ok = RunCommand(
      {CliBinary(), "--target", server().target(), "--root_ca", Certs::Path("ca.pem"),
       "--client_cert", Certs::Path("client.pem"), "--client_key", Certs::Path("client.key"),
       "--timeout", "10", "health"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const CommandResult no_cert = RunCommand({CliBinary(), "--target", server().target(), "--root_ca",
                                            Certs::Path("ca.pem"), "--timeout", "5", "health"});
  EXPECT_NE(no_cert.exit_code, 0) << no_cert.output;
  const CommandResult wrong_cert = RunCommand(
      {CliBinary(), "--target", server().target(), "--root_ca", Certs::Path("ca.pem"),
       "--client_cert", Certs::Path("other_client.pem"), "--client_key",
       Certs::Path("other_client.key"), "--timeout", "5", "health"});
  EXPECT_NE(wrong_cert.exit_code, 0) << wrong_cert.output;
}

// ---------------------------------------------------------------------------------------------
// Bearer tokens: --auth_tokens_file

class TokenFile {
 public:
  TokenFile() {
    path_ = Certs::Path("tokens.txt");
    std::ofstream out(path_);
    out << "# tenant:token\n"
        << "alice:tok-alice-0123456789\n"
        << "bob:tok-bob-9876543210\n";
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

constexpr char kAlice[] = "tok-alice-0123456789";
constexpr char kBob[] = "tok-bob-9876543210";

class TokenTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    static const TokenFile* const kFile = new TokenFile();
    return {"--auth_tokens_file=" + kFile->path()};
  }
  client::ClientOptions DefaultClientOptions() const override { return As(kAlice); }

  static client::ClientOptions As(const std::string& token) {
    client::ClientOptions o;
    o.bearer_token = token;
    o.timeout = absl::Seconds(10);
    return o;
  }

  // Every RPC of opserve.v1.OpServe, through the generated stub with `authorization` set to
  // `header` (none when empty); their codes.
  std::map<std::string, grpc::StatusCode> EveryRpc(const std::string& header) {
    auto prepare = [&](grpc::ClientContext& ctx) {
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      if (!header.empty()) ctx.AddMetadata("authorization", header);
    };
    std::map<std::string, grpc::StatusCode> codes;
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::PutTensorResponse resp;
      auto w = stub().PutTensor(&ctx, &resp);
      v1::PutTensorRequest m;
      m.mutable_header()->set_name("intruder");
      m.mutable_header()->set_dtype(v1::FLOAT32);
      m.mutable_header()->add_shape(4);
      w->Write(m);
      m.set_chunk(std::string(16, '\0'));
      w->Write(m);
      w->WritesDone();
      codes["PutTensor"] = w->Finish().error_code();
    }
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::GetTensorRequest req;
      req.set_name("secret");
      auto r = stub().GetTensor(&ctx, req);
      v1::GetTensorResponse m;
      while (r->Read(&m)) {
      }
      codes["GetTensor"] = r->Finish().error_code();
    }
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::DeleteTensorRequest req;
      req.set_name("secret");
      v1::DeleteTensorResponse resp;
      codes["DeleteTensor"] = stub().DeleteTensor(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::ListTensorsResponse resp;
      codes["ListTensors"] = stub().ListTensors(&ctx, v1::ListTensorsRequest(), &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::ExecuteRequest req;
      AddNode(req, "s", "sum", {Stored("secret")});
      AddOutput(req, "s", true);
      v1::ExecuteResponse resp;
      codes["Execute"] = stub().Execute(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::ListOpsResponse resp;
      codes["ListOps"] = stub().ListOps(&ctx, v1::ListOpsRequest(), &resp).error_code();
    }
    return codes;
  }
};

TEST_F(TokenTest, MissingOrWrongTokenIsUnauthenticatedOnEveryRpc) {
  const client::HostTensor secret = RandomTensor(v1::FLOAT32, {8}, rng_);
  ASSERT_TRUE(client().PutTensor("secret", secret, false).ok());
  const uint64_t used = UsedBytes();
  for (const std::string& header :
       {std::string(), std::string("Bearer"), std::string("Bearer "), std::string("Bearer wrong"),
        absl::StrCat("Bearer ", kAlice, "x"), absl::StrCat("Bearer ", std::string(kAlice).substr(0, 10)),
        absl::StrCat("Basic ", kAlice), std::string(kAlice), absl::StrCat("Bearer  ", kAlice),
        absl::StrCat("Bearer alice")}) {
    SCOPED_TRACE(absl::StrCat("authorization: '", header, "'"));
    for (const auto& [rpc, code] : EveryRpc(header)) {
      EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << rpc;
    }
  }
  // The right token, through the same calls: no UNAUTHENTICATED.
  for (const auto& [rpc, code] : EveryRpc(absl::StrCat("Bearer ", kAlice))) {
    EXPECT_NE(code, grpc::StatusCode::UNAUTHENTICATED) << rpc;
  }
  // The refused calls changed nothing and held no memory. (The authorized pass above deleted
  // "secret" and stored "intruder"; put them back to compare.)
  ASSERT_TRUE(client().DeleteTensor("intruder").ok());
  ASSERT_TRUE(client().PutTensor("secret", secret, false).ok());
  EXPECT_EQ(UsedBytes(), used);
  EXPECT_EQ(client().ListTensors()->size(), 1u);
  // The client library and the CLI: the same.
  EXPECT_EQ(NewClient(As(""))->ListTensors().status().code(), Code::kUnauthenticated);
  EXPECT_EQ(NewClient(As("nope"))->ListOps().status().code(), Code::kUnauthenticated);
  const CommandResult cli = RunCommand({CliBinary(), "--target", server().target(), "ls"});
  EXPECT_NE(cli.exit_code, 0);
  EXPECT_NE(cli.output.find("UNAUTHENTICATED"), std::string::npos) << cli.output;
  const CommandResult cli_ok =
      RunCommand({CliBinary(), "--target", server().target(), "--token", kAlice, "ls"});
  EXPECT_EQ(cli_ok.exit_code, 0) << cli_ok.output;
  EXPECT_NE(cli_ok.output.find("secret"), std::string::npos) << cli_ok.output;
}

// A request that does not parse (a GetTensor name of raw bytes): without a valid token the
// caller learns only UNAUTHENTICATED; with one, INVALID_ARGUMENT naming the RPC and the field.
// Both are counted in opserve_requests_total like any other answer.
TEST_F(TokenTest, UnparsableRequestsAreAuthenticatedFirstAndCounted) {
  const std::string bad_name = std::string("\x0a\x02\xff\xfe", 4);  // GetTensorRequest.name
  const double unauthenticated = Requests("GetTensor", "UNAUTHENTICATED");
  const double invalid = Requests("GetTensor", "INVALID_ARGUMENT");
  e2e::RawResult r = e2e::RawCall(server().target(), "GetTensor", {bad_name},
                                  {{"authorization", "Bearer wrong"}});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << r.status.error_message();
  EXPECT_EQ(r.status.error_message().find("UTF-8"), std::string::npos) << r.status.error_message();
  r = e2e::RawCall(server().target(), "GetTensor", {bad_name},
                   {{"authorization", absl::StrCat("Bearer ", kAlice)}});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("GetTensor: "), std::string::npos)
      << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("name is not valid UTF-8"), std::string::npos)
      << r.status.error_message();
  EXPECT_EQ(Requests("GetTensor", "UNAUTHENTICATED"), unauthenticated + 1);
  EXPECT_EQ(Requests("GetTensor", "INVALID_ARGUMENT"), invalid + 1);
  EXPECT_EQ(Requests("GetTensor", "UNIMPLEMENTED"), 0);
  EXPECT_TRUE(Serving());
}

TEST_F(TokenTest, HealthStaysOpenWithoutAToken) {
  for (const char* token : {"", "wrong", kBob}) {
    absl::StatusOr<bool> serving = NewClient(As(token))->HealthServing();
    ASSERT_TRUE(serving.ok()) << "token '" << token << "': " << serving.status();
    EXPECT_TRUE(*serving);
  }
  const CommandResult cli = RunCommand({CliBinary(), "--target", server().target(), "health"});
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
}

// Tenant B against tenant A's tensors: nothing to list, read, delete or compute with; a put or
// store_as under A's name makes B's own tensor (no ALREADY_EXISTS that would confirm A's name);
// and B's errors for A's names read exactly like those for names nobody has.
TEST_F(TokenTest, TenantsCannotSeeOrTouchEachOthersTensors) {
  auto alice = NewClient(As(kAlice));
  auto bob = NewClient(As(kBob));
  const client::HostTensor a_secret = RandomTensor(v1::FLOAT32, {16, 16}, rng_);
  const client::HostTensor a_other = RandomTensor(v1::FLOAT32, {4, 4}, rng_);
  ASSERT_TRUE(alice->PutTensor("secret", a_secret, false).ok());
  ASSERT_TRUE(alice->PutTensor("weights/layer0", a_other, false).ok());

  // List.
  absl::StatusOr<std::vector<v1::TensorInfo>> bob_list = bob->ListTensors();
  ASSERT_TRUE(bob_list.ok());
  EXPECT_TRUE(bob_list->empty());

  // Read, delete, Execute input: NOT_FOUND, worded as for a name that exists nowhere.
  auto same_as_absent = [](const absl::Status& for_a, const absl::Status& for_nobody,
                           const std::string& a_name) {
    EXPECT_EQ(for_a.code(), Code::kNotFound) << for_a;
    EXPECT_EQ(for_a.code(), for_nobody.code());
    EXPECT_EQ(std::string(for_a.message()),
              absl::StrReplaceAll(std::string(for_nobody.message()), {{"nobody_has_this", a_name}}));
  };
  same_as_absent(bob->GetTensor("secret").status(), bob->GetTensor("nobody_has_this").status(),
                 "secret");
  same_as_absent(bob->DeleteTensor("secret").status(),
                 bob->DeleteTensor("nobody_has_this").status(), "secret");
  auto sum_of = [&](const std::string& name) {
    v1::ExecuteRequest r;
    AddNode(r, "s", "sum", {Stored(name)});
    AddOutput(r, "s", true);
    return r;
  };
  same_as_absent(bob->Execute(sum_of("secret")).status(),
                 bob->Execute(sum_of("nobody_has_this")).status(), "secret");

  // Overwrite: a put without overwrite succeeds, as for a free name, and makes Bob's own.
  const client::HostTensor b_secret = RandomTensor(v1::INT32, {3}, rng_);
  absl::StatusOr<v1::TensorInfo> put = bob->PutTensor("secret", b_secret, false);
  ASSERT_TRUE(put.ok()) << "Bob's put under Alice's name: " << put.status();
  // With overwrite, Bob replaces only his own.
  const client::HostTensor b_secret2 = RandomTensor(v1::INT32, {5}, rng_);
  ASSERT_TRUE(bob->PutTensor("secret", b_secret2, true).ok());
  // And Execute's store_as under Alice's other name: Bob's own again.
  v1::ExecuteRequest store;
  AddInline(store, "x", F32({2, 2}, {1, 2, 3, 4}));
  AddNode(store, "t", "transpose", {Inline("x")});
  AddOutput(store, "t", false, "weights/layer0");
  absl::StatusOr<v1::ExecuteResponse> stored = bob->Execute(store);
  ASSERT_TRUE(stored.ok()) << stored.status();

  absl::StatusOr<client::HostTensor> bob_reads = bob->GetTensor("secret");
  ASSERT_TRUE(bob_reads.ok());
  EXPECT_TRUE(bob_reads->data == b_secret2.data);
  EXPECT_EQ(bob->ListTensors()->size(), 2u);

  // Alice's tensors are as she left them.
  absl::StatusOr<client::HostTensor> a1 = alice->GetTensor("secret");
  absl::StatusOr<client::HostTensor> a2 = alice->GetTensor("weights/layer0");
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_TRUE(a1->data == a_secret.data) << "Bob's put changed Alice's 'secret'";
  EXPECT_EQ(a1->shape, a_secret.shape);
  EXPECT_TRUE(a2->data == a_other.data) << "Bob's store_as changed Alice's 'weights/layer0'";
  absl::StatusOr<std::vector<v1::TensorInfo>> alice_list = alice->ListTensors();
  ASSERT_TRUE(alice_list.ok());
  ASSERT_EQ(alice_list->size(), 2u);
  EXPECT_EQ((*alice_list)[0].dtype(), v1::FLOAT32);

  // Bob deletes his 'secret' (and only his).
  ASSERT_TRUE(bob->DeleteTensor("secret").ok());
  EXPECT_TRUE(alice->GetTensor("secret").ok());
  EXPECT_EQ(bob->GetTensor("secret").status().code(), Code::kNotFound);
  // Alice's Execute still reads her own.
  absl::StatusOr<v1::ExecuteResponse> a_sum = alice->Execute(sum_of("secret"));
  EXPECT_TRUE(a_sum.ok()) << a_sum.status();
}

// TLS and tokens together: the token travels encrypted, and a token is still required.
class TlsTokenTest : public TokenTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    std::vector<std::string> flags = TokenTest::ExtraFlags();
    flags.push_back("--tls_cert=" + Certs::Path("server.pem"));
    flags.push_back("--tls_key=" + Certs::Path("server.key"));
    return flags;
  }
  client::ClientOptions DefaultClientOptions() const override {
    client::ClientOptions o = Tls();
    o.bearer_token = kAlice;
    return o;
  }
};

TEST_F(TlsTokenTest, TokenOverTlsWorksAndIsStillRequired) {
  ASSERT_TRUE(client().PutTensor("t", RandomTensor(v1::FLOAT32, {4}, rng_), false).ok());
  EXPECT_EQ(client().ListTensors()->size(), 1u);
  EXPECT_EQ(NewClient(Tls())->ListTensors().status().code(), Code::kUnauthenticated);
  EXPECT_TRUE(Serving());
  const CommandResult cli = RunCommand({CliBinary(), "--target", server().target(), "--root_ca",
                                        Certs::Path("ca.pem"), "--token", kAlice, "ls"});
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
}

}  // namespace
}  // namespace opserve::hardening
