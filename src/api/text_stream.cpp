// TextStream: decode everything so far, cut at the first stop string, hold back a possible stop
// string's start and an unfinished character, release the rest.
#include "api/text_stream.h"

#include <algorithm>
#include <string_view>

namespace colony::api {

namespace {

// Bytes at the end of `s` that may be completed by later bytes: an unfinished UTF-8 sequence, or
// a trailing U+FFFD (a decoder's stand-in for one).
size_t UnfinishedTail(std::string_view s) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (s.ends_with(kReplacement)) return kReplacement.size();
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t need = 0;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

// The longest suffix of `s` (from `from` on) that is a proper prefix of a stop string.
size_t PossibleStopStart(std::string_view s, size_t from, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const auto& stop : stops) {
    if (stop.empty()) continue;  // (no stop string)
    const size_t max_len = std::min(stop.size() - 1, s.size() - from);
    for (size_t len = max_len; len > longest; --len) {
      if (s.substr(s.size() - len) == std::string_view(stop).substr(0, len)) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

TextStream::TextStream(Decode decode, std::vector<std::string> stops, int64_t min_tokens,
                       size_t kept)
    : decode_(std::move(decode)), stops_(std::move(stops)), min_tokens_(min_tokens), kept_(kept) {}

std::string TextStream::Add(int64_t token) {
  if (stopped_) return {};
  tokens_.push_back(static_cast<int32_t>(token));
  return Release(/*final=*/false);
}

std::string TextStream::Finish() {
  if (stopped_) return {};
  return Release(/*final=*/true);
}

std::string TextStream::Release(bool final) {
  const std::string full = decode_(tokens_);
  // Until min_tokens tokens are here no stop string counts; then only one that ends after
  // their text, as much of it as later tokens left as it was (a decoder rewrites an unfinished
  // character's stand-in when the character is completed).
  if (static_cast<int64_t>(tokens_.size()) <= min_tokens_) first_text_ = full;
  const size_t unstoppable =
      static_cast<size_t>(std::ranges::mismatch(first_text_, full).in1 - first_text_.begin());
  // A decoder may rewrite the end of its text when more tokens come (merged bytes): wait until
  // what was sent is still the text's beginning.
  if (full.size() < released_.size() || full.compare(0, released_.size(), released_) != 0) {
    return {};
  }
  size_t end = full.size();
  int64_t found = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const std::string& stop = stops_[i];
    if (stop.empty()) continue;
    // Nothing sent can be a stop string's start (it was held back).
    const size_t from =
        std::max(released_.size(), unstoppable >= stop.size() ? unstoppable - stop.size() + 1 : 0);
    if (const size_t at = full.find(stop, from); at != std::string::npos && at < end) {
      end = at;
      found = static_cast<int64_t>(i);
    }
  }
  if (found >= 0) {
    stopped_ = true;
    stop_index_ = found;
    if (static_cast<size_t>(found) < kept_) end += stops_[static_cast<size_t>(found)].size();
  } else if (!final) {
    end -= std::max(UnfinishedTail(full), PossibleStopStart(full, released_.size(), stops_));
  }
  if (end <= released_.size()) return {};
  std::string out = full.substr(released_.size(), end - released_.size());
  released_ += out;
  return out;
}

}  // namespace colony::api
