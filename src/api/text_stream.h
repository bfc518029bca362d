// TextStream: the text of a completion as its tokens arrive, for streaming answers and stop
// strings. Each Add() returns the text that is safe to send now: never the start of what may yet
// become a stop string, never an incomplete UTF-8 sequence (or the replacement character a
// decoder writes for one), never text the decoder may still rewrite. Torch-free.
//
//   TextStream text(decode, {"\nUser:"});
//   for (token : generated) { send(text.Add(token)); if (text.stopped()) break; }
//   send(text.Finish());
//   // text.text() == everything sent, ending before the first stop string
//
// With min_tokens (vLLM's), a stop string counts only where it ends after the text of the first
// min_tokens tokens, as vLLM checks stop strings only in text that comes after them (the text
// they keep as it was: a character they left unfinished, which a later token completes, is
// text after them).
//
// The first `kept` stop strings (the request's, with vLLM's include_stop_str_in_output) end the
// text with themselves instead of before them. stop_index() names the stop string that ended the
// text: the one that begins first (vLLM takes the first given of those in the newest token's
// text: the same unless two complete in one token); of two that begin at the same place, the
// first given, when both are there at once (a shorter one that a token completes first cuts).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace colony::api {

class TextStream {
 public:
  using Decode = std::function<std::string(std::span<const int32_t>)>;
  TextStream(Decode decode, std::vector<std::string> stops, int64_t min_tokens = 0,
             size_t kept = 0);

  // Adds a generated token; returns the text released by it (often empty). After a stop string
  // appears, stopped() is true and the text ends before it; further tokens are ignored.
  std::string Add(int64_t token);
  // The end of generation: releases what was held back (it was no stop string after all).
  std::string Finish();
  bool stopped() const { return stopped_; }
  // The index in `stops` of the stop string that ended the text; -1 while none has.
  int64_t stop_index() const { return stop_index_; }
  const std::string& text() const { return released_; }

 private:
  // Decodes every token so far and releases what is safe (everything when `final`).
  std::string Release(bool final);

  Decode decode_;
  std::vector<std::string> stops_;
  int64_t min_tokens_;
  size_t kept_;
  // The text while there are at most min_tokens tokens (then: of the first min_tokens).
  std::string first_text_;
  std::vector<int32_t> tokens_;
  std::string released_;
  bool stopped_ = false;
  int64_t stop_index_ = -1;
};

}  // namespace colony::api
