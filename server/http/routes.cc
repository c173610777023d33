#include "server/http/routes.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace opserve::http {
namespace {

struct Match {
  Endpoint endpoint;
  bool post;
  bool get_or_post = false;  // Triton's trace and log settings: GET reads, POST updates
};

// The endpoint after /v2/models/{model}[/versions/{version}].
std::optional<Match> ModelAction(absl::string_view action) {
  if (action.empty()) return Match{Endpoint::kModelMetadata, false};
  if (action == "ready") return Match{Endpoint::kModelReady, false};
  if (action == "config") return Match{Endpoint::kModelConfig, false};
  if (action == "stats") return Match{Endpoint::kModelStatistics, false};
  if (action == "infer") return Match{Endpoint::kModelInfer, true};
  if (action == "trace/setting") return Match{Endpoint::kTraceSetting, true, true};
  return std::nullopt;
}

std::optional<Match> SharedMemoryAction(absl::string_view action, bool has_region) {
  if (action == "status") return Match{Endpoint::kSharedMemoryStatus, false};
  if (action == "unregister") return Match{Endpoint::kSharedMemoryUnregister, true};
  if (action == "register" && has_region) return Match{Endpoint::kSharedMemoryRegister, true};
  return std::nullopt;
}

}  // namespace

absl::StatusOr<Route> FindRoute(absl::string_view method, absl::string_view path,
                                bool* method_not_allowed) {
  *method_not_allowed = false;
  const std::vector<absl::string_view> s = absl::StrSplit(path, '/', absl::SkipEmpty());
  const size_t n = s.size();
  Route route{};
  std::optional<Match> m;
  if (n >= 1 && s[0] == "v2") {
    if (n == 1) {
      m = Match{Endpoint::kServerMetadata, false};
    } else if (n == 3 && s[1] == "health" && s[2] == "live") {
      m = Match{Endpoint::kServerLive, false};
    } else if (n == 3 && s[1] == "health" && s[2] == "ready") {
      m = Match{Endpoint::kServerReady, false};
    } else if (n == 3 && s[1] == "repository" && s[2] == "index") {
      m = Match{Endpoint::kRepositoryIndex, true};
    } else if (n == 5 && s[1] == "repository" && s[2] == "models" &&
               (s[4] == "load" || s[4] == "unload")) {
      route.model = std::string(s[3]);
      m = Match{s[4] == "load" ? Endpoint::kRepositoryModelLoad : Endpoint::kRepositoryModelUnload,
                true};
    } else if (n == 3 && s[1] == "trace" && s[2] == "setting") {
      m = Match{Endpoint::kTraceSetting, true, true};
    } else if (n == 2 && s[1] == "logging") {
      m = Match{Endpoint::kLogSettings, true, true};
    } else if (n == 3 && s[1] == "models" && s[2] == "stats") {
      m = Match{Endpoint::kModelStatistics, false};
    } else if (n >= 3 && s[1] == "models") {
      route.model = std::string(s[2]);
      size_t at = 3;
      if (n >= 5 && s[3] == "versions") {
        route.version = std::string(s[4]);
        at = 5;
      }
      if (n == at) m = ModelAction("");
      if (n == at + 1) m = ModelAction(s[at]);
      if (n == at + 2) m = ModelAction(absl::StrCat(s[at], "/", s[at + 1]));
    } else if (n >= 3 && (s[1] == "systemsharedmemory" || s[1] == "cudasharedmemory")) {
      route.cuda = s[1] == "cudasharedmemory";
      if (n == 3) m = SharedMemoryAction(s[2], false);
      if (n == 5 && s[2] == "region") {
        route.region = std::string(s[3]);
        m = SharedMemoryAction(s[4], true);
      }
    }
  }
  if (!m.has_value()) {
    const bool v2 = n >= 1 && s[0] == "v2";
    return absl::NotFoundError(absl::StrCat(
        "no endpoint ", method, " ", path,
        v2 ? "" : " (the Open Inference Protocol's paths start /v2)"));
  }
  const absl::string_view want = m->get_or_post ? "GET or POST" : m->post ? "POST" : "GET";
  if (method != (m->post ? "POST" : "GET") && !(m->get_or_post && method == "GET")) {
    *method_not_allowed = true;
    return absl::InvalidArgumentError(absl::StrCat(path, " takes ", want, ", not ", method));
  }
  route.endpoint = m->endpoint;
  return route;
}

}  // namespace opserve::http
