// Prometheus' text exposition format (version 0.0.4), for the GET /metrics of colony monitor and
// colony api: a family's samples collected, then written whole after its HELP and TYPE lines
// (the format wants them together), label values escaped; and histograms of fixed buckets.
//
//   http::PrometheusFamily served("colony_api_requests_total", "counter", "Requests answered.");
//   served.Add({{"endpoint", "completions"}, {"status", "200"}}, 12);
//   std::string out;
//   served.WriteTo(out);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace colony::http {

// A label value escaped as the format requires (backslash, double quote and newline).
std::string EscapeLabelValue(std::string_view value);

using PrometheusLabels = std::vector<std::pair<std::string, std::string>>;

class PrometheusFamily {
 public:
  PrometheusFamily(std::string name, std::string type, std::string help);

  // A sample of the family's name followed by `suffix` (a histogram's _bucket, _sum, _count).
  void Add(const PrometheusLabels& labels, double value, std::string_view suffix = {});
  void WriteTo(std::string& out) const;

 private:
  std::string name_, type_, help_;
  std::vector<std::string> lines_;
};

// A family of one sample without labels, written whole to `out`.
void WritePrometheusSample(std::string& out, std::string name, std::string type, std::string help,
                           double value);

// Observations counted into buckets by their upper bounds (each bucket holds the values at most
// its bound and above the one before; the last, +Inf, the rest).
class PrometheusHistogram {
 public:
  explicit PrometheusHistogram(std::vector<double> bounds);  // ascending
  void Observe(double value);
  // Its samples (cumulative _bucket{le}, _sum, _count) into a family of type histogram.
  void AddTo(PrometheusFamily& family, const PrometheusLabels& labels = {}) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, the +Inf one last
  double sum_ = 0;
  int64_t count_ = 0;
};

}  // namespace colony::http
