// opserve-bench's output: one table (markdown, so it can be pasted as is), the target lines,
// and the same figures as CSV and JSON.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench.h"

namespace opserve::bench {
namespace {

std::string Num(double v, int digits) {
  if (v == 0) return "-";
  return absl::StrFormat("%.*f", digits, v);
}

std::string Check(const Row& r) {
  if (r.error < 0) return "-";
  if (!r.error_ok) return absl::StrFormat("FAIL %.2g", r.error);
  return absl::StrFormat("ok %.1g", r.error);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNum(double v) {
  if (v != v) return "null";  // NaN
  return absl::StrFormat("%.6g", v);
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

void PrintReport(const Report& rep) {
  std::printf("\n## opserve-bench: %s, %s\n", rep.device.c_str(), rep.date.c_str());
  std::printf("command: %s\n", rep.command.c_str());
  std::printf("ceilings: D2D copy %.0f GB/s (read + written), float4 read stream %.0f GB/s; "
              "floor: an empty kernel %.2f us\n\n",
              rep.copy_gbps, rep.stream_gbps, rep.floor_us);
  std::printf(
      "| op | shape | dtype | algorithm | median us | GB/s | TFLOP/s | anchor | ratio | vs stream "
      "| auto/fastest | check |\n");
  std::printf("|---|---|---|---|---:|---:|---:|---|---:|---:|---|---|\n");
  for (const Row& r : rep.rows) {
    const std::string algo = r.is_anchor ? absl::StrCat("[", r.algorithm, "]") : r.algorithm;
    const std::string best =
        r.best.empty() ? "" : absl::StrFormat("%.3f of %s", r.vs_best, r.best);
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.op.c_str(),
                r.shape.c_str(), r.dtype.c_str(), algo.c_str(), Num(r.median_us, 1).c_str(),
                Num(r.gbps, 0).c_str(), Num(r.tflops, 1).c_str(), r.anchor.c_str(),
                r.is_anchor ? "1" : Num(r.ratio, 3).c_str(), Num(r.ratio2, 3).c_str(),
                best.c_str(), Check(r).c_str());
  }
  const ServiceFigures& s = rep.service;
  if (s.ran) {
    std::printf(
        "\nservice (loopback gRPC, row_mean %s on a stored 4096x4096): Execute p50 %.1f us, p99 "
        "%.1f us (%d calls); kernel p50 %.1f us; overhead p50 %.1f us; Health/Check (blocking unary) p50 %.1f us, "
        "p99 %.1f us (%d calls), through the client library p50 %.1f us; server's own timing "
        "p50: total %.1f us = queue %.1f + input %.1f + compute %.1f + output %.1f; PutTensor "
        "1 GiB %.2f GB/s, GetTensor 1 GiB %.2f GB/s\n",
        s.algorithm.c_str(), s.execute_p50_us, s.execute_p99_us, s.executes, s.kernel_p50_us,
        s.overhead_p50_us, s.health_p50_us, s.health_p99_us, s.health_checks,
        s.client_health_p50_us, s.server_total_p50_us, s.server_queue_p50_us,
        s.server_input_p50_us, s.server_compute_p50_us, s.server_output_p50_us, s.put_gbps,
        s.get_gbps);
  } else if (!s.error.empty()) {
    std::printf("\nservice: not measured: %s\n", s.error.c_str());
  }
  if (!rep.targets.empty()) {
    int held = 0, ties = 0;
    std::printf("\ntargets:\n");
    for (const TargetCheck& t : rep.targets) {
      std::printf("  %-4s %-62s %s\n", t.holds ? "OK" : (t.tie ? "TIE" : "MISS"), t.what.c_str(),
                  t.measured.c_str());
      held += t.holds;
      ties += t.tie;
    }
    std::printf("  %d of %zu hold", held, rep.targets.size());
    if (ties > 0) std::printf(", %d tie%s (auto runs the anchor's own kernel)", ties, ties > 1 ? "s" : "");
    std::printf(", %d miss\n", static_cast<int>(rep.targets.size()) - held - ties);
  }
  std::fflush(stdout);
}

bool WriteReport(const Report& rep, const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "opserve-bench: cannot create %s: %s\n", dir.c_str(), std::strerror(errno));
    return false;
  }
  const std::string csv_path = dir + "/bench.csv", json_path = dir + "/bench.json";
  std::ofstream csv(csv_path);
  csv << "op,shape,dtype,algorithm,is_anchor,reps,median_us,min_us,p90_us,bytes,flops,gbps,"
         "tflops,anchor,ratio,anchor2,ratio2,fastest,auto_vs_fastest,error,check_ok\n";
  for (const Row& r : rep.rows) {
    csv << CsvField(r.op) << ',' << CsvField(r.shape) << ',' << r.dtype << ','
        << CsvField(r.algorithm) << ',' << (r.is_anchor ? 1 : 0) << ',' << r.reps << ','
        << absl::StrFormat("%.3f,%.3f,%.3f", r.median_us, r.min_us, r.p90_us) << ',' << r.bytes
        << ',' << r.flops << ',' << absl::StrFormat("%.2f,%.3f", r.gbps, r.tflops) << ','
        << r.anchor << ',' << absl::StrFormat("%.4f", r.ratio) << ',' << r.anchor2 << ','
        << absl::StrFormat("%.4f", r.ratio2) << ',' << r.best << ','
        << absl::StrFormat("%.4f", r.vs_best) << ',' << absl::StrFormat("%.3g", r.error) << ','
        << (r.error_ok ? 1 : 0) << '\n';
  }
  std::ofstream js(json_path);
  js << "{\n  \"device\": " << JsonString(rep.device) << ",\n  \"date\": " << JsonString(rep.date)
     << ",\n  \"command\": " << JsonString(rep.command)
     << ",\n  \"copy_gbps\": " << JsonNum(rep.copy_gbps)
     << ",\n  \"stream_gbps\": " << JsonNum(rep.stream_gbps)
     << ",\n  \"floor_us\": " << JsonNum(rep.floor_us) << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rep.rows.size(); ++i) {
    const Row& r = rep.rows[i];
    js << "    {\"op\": " << JsonString(r.op) << ", \"shape\": " << JsonString(r.shape)
       << ", \"dtype\": " << JsonString(r.dtype) << ", \"algorithm\": " << JsonString(r.algorithm)
       << ", \"is_anchor\": " << (r.is_anchor ? "true" : "false") << ", \"reps\": " << r.reps
       << ", \"median_us\": " << JsonNum(r.median_us) << ", \"min_us\": " << JsonNum(r.min_us)
       << ", \"p90_us\": " << JsonNum(r.p90_us) << ", \"bytes\": " << r.bytes
       << ", \"flops\": " << r.flops << ", \"gbps\": " << JsonNum(r.gbps)
       << ", \"tflops\": " << JsonNum(r.tflops) << ", \"anchor\": " << JsonString(r.anchor)
       << ", \"ratio\": " << JsonNum(r.ratio) << ", \"anchor2\": " << JsonString(r.anchor2)
       << ", \"ratio2\": " << JsonNum(r.ratio2) << ", \"fastest\": " << JsonString(r.best)
       << ", \"auto_vs_fastest\": " << JsonNum(r.vs_best) << ", \"error\": " << JsonNum(r.error)
       << ", \"check_ok\": " << (r.error_ok ? "true" : "false") << "}"
       << (i + 1 < rep.rows.size() ? "," : "") << "\n";
  }
  const ServiceFigures& s = rep.service;
  js << "  ],\n  \"service\": {\"ran\": " << (s.ran ? "true" : "false")
     << ", \"error\": " << JsonString(s.error) << ", \"algorithm\": " << JsonString(s.algorithm)
     << ", \"executes\": " << s.executes << ", \"execute_p50_us\": " << JsonNum(s.execute_p50_us)
     << ", \"execute_p99_us\": " << JsonNum(s.execute_p99_us)
     << ", \"kernel_p50_us\": " << JsonNum(s.kernel_p50_us)
     << ", \"overhead_p50_us\": " << JsonNum(s.overhead_p50_us)
     << ", \"health_checks\": " << s.health_checks
     << ", \"health_p50_us\": " << JsonNum(s.health_p50_us)
     << ", \"health_p99_us\": " << JsonNum(s.health_p99_us)
     << ", \"client_health_p50_us\": " << JsonNum(s.client_health_p50_us)
     << ", \"server_total_p50_us\": " << JsonNum(s.server_total_p50_us)
     << ", \"server_queue_p50_us\": " << JsonNum(s.server_queue_p50_us)
     << ", \"server_input_p50_us\": " << JsonNum(s.server_input_p50_us)
     << ", \"server_compute_p50_us\": " << JsonNum(s.server_compute_p50_us)
     << ", \"server_output_p50_us\": " << JsonNum(s.server_output_p50_us)
     << ", \"put_gbps\": " << JsonNum(s.put_gbps) << ", \"get_gbps\": " << JsonNum(s.get_gbps)
     << "},\n  \"targets\": [\n";
  for (size_t i = 0; i < rep.targets.size(); ++i) {
    const TargetCheck& t = rep.targets[i];
    js << "    {\"what\": " << JsonString(t.what) << ", \"measured\": " << JsonString(t.measured)
       << ", \"holds\": " << (t.holds ? "true" : "false")
       << ", \"tie\": " << (t.tie ? "true" : "false") << "}"
       << (i + 1 < rep.targets.size() ? "," : "") << "\n";
  }
  js << "  ]\n}\n";
  if (!csv || !js) {
    std::fprintf(stderr, "opserve-bench: could not write %s / %s\n", csv_path.c_str(),
                 json_path.c_str());
    return false;
  }
  std::printf("wrote %s and %s\n", csv_path.c_str(), json_path.c_str());
  return true;
}

}  // namespace opserve::bench
