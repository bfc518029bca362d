// Prometheus' text exposition format: families of samples and fixed-bucket histograms.
#include "http/prometheus.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace colony::http {

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

}  // namespace

PrometheusFamily::PrometheusFamily(std::string name, std::string type, std::string help)
    : name_(std::move(name)), type_(std::move(type)), help_(std::move(help)) {}

void PrometheusFamily::Add(const PrometheusLabels& labels, double value, std::string_view suffix) {
  std::string line = name_ + std::string(suffix);
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) line += ',';
      line += labels[i].first + "=\"" + EscapeLabelValue(labels[i].second) + '"';
    }
    line += '}';
  }
  line += ' ' + Number(value);
  lines_.push_back(std::move(line));
}

void PrometheusFamily::WriteTo(std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name_, help_, name_, type_);
  for (const auto& l : lines_) out += l + '\n';
}

void WritePrometheusSample(std::string& out, std::string name, std::string type, std::string help,
                           double value) {
  PrometheusFamily family(std::move(name), std::move(type), std::move(help));
  family.Add({}, value);
  family.WriteTo(out);
}

PrometheusHistogram::PrometheusHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void PrometheusHistogram::Observe(double value) {
  const auto bucket = std::ranges::lower_bound(bounds_, value) - bounds_.begin();
  ++counts_[static_cast<size_t>(bucket)];
  sum_ += value;
  ++count_;
}

void PrometheusHistogram::AddTo(PrometheusFamily& family, const PrometheusLabels& labels) const {
  int64_t below = 0;
  for (size_t b = 0; b < counts_.size(); ++b) {
    below += counts_[b];
    PrometheusLabels with = labels;
    with.emplace_back("le", b < bounds_.size() ? Number(bounds_[b]) : "+Inf");
    family.Add(with, static_cast<double>(below), "_bucket");
  }
  family.Add(labels, sum_, "_sum");
  family.Add(labels, static_cast<double>(count_), "_count");
}

}  // namespace colony::http
