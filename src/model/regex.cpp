// Regex (regex.h): Oniguruma, initialised once for UTF-8, with a per-search backtracking budget.
#include "model/regex.h"

#include <oniguruma.h>

#include <mutex>
#include <string>

#include "model/utf8.h"

namespace colony::model {
namespace {

// Backtracking steps one search may take. Ordinary tokenizer patterns need a few per byte; this
// bounds a pathological pattern to well under a second of CPU per search.
constexpr unsigned long kRetryLimit = 20'000'000;

void InitializeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string OnigMessage(int code, OnigErrorInfo* info) {
  OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int len =
      info ? onig_error_code_to_str(buf, code, info) : onig_error_code_to_str(buf, code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(len > 0 ? len : 0));
}

}  // namespace

struct Regex::Impl {
  regex_t* re = nullptr;
  ~Impl() {
    if (re) onig_free(re);
  }
};

Regex::Regex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Regex::~Regex() = default;

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  if (pattern.size() > kMaxPatternBytes) {
    return InvalidArgument("regex of " + std::to_string(pattern.size()) +
                           " bytes is over the limit of " + std::to_string(kMaxPatternBytes));
  }
  if (!IsValidUtf8(pattern)) return InvalidArgument("regex is not valid UTF-8");
  InitializeOnce();
  auto impl = std::make_unique<Impl>();
  OnigErrorInfo info{};
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&impl->re, begin, begin + pattern.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_RUBY, &info);
  if (rc != ONIG_NORMAL) {
    impl->re = nullptr;
    return InvalidArgument("bad regex '" + std::string(pattern.substr(0, 200)) +
                           "': " + OnigMessage(rc, &info));
  }
  return std::unique_ptr<Regex>(new Regex(std::move(impl)));
}

Status Regex::FindAll(std::string_view text, std::vector<Match>& out) const {
  struct Scratch {
    OnigRegion* region = onig_region_new();
    OnigMatchParam* param = onig_new_match_param();
    ~Scratch() {
      onig_region_free(region, 1);
      onig_free_match_param(param);
    }
  } s;
  if (!s.region || !s.param) return ResourceExhausted("out of memory for a regex search");
  onig_initialize_match_param(s.param);
  onig_set_retry_limit_in_match_of_match_param(s.param, kRetryLimit);
  onig_set_retry_limit_in_search_of_match_param(s.param, kRetryLimit);
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = onig_search_with_param(impl_->re, str, end, str + pos, end, s.region,
                                          ONIG_OPTION_NONE, s.param);
    if (rc == ONIG_MISMATCH) break;
    if (rc < 0) return ResourceExhausted("regex search failed: " + OnigMessage(rc, nullptr));
    const auto b = static_cast<size_t>(s.region->beg[0]);
    const auto e = static_cast<size_t>(s.region->end[0]);
    if (e > b) {
      out.push_back({b, e});
      pos = e;
    } else {
      if (b >= text.size()) break;
      pos = b + std::max<size_t>(1, Utf8CharLen(text.substr(b)));
    }
  }
  return Status::Ok();
}

}  // namespace colony::model
