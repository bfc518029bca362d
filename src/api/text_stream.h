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
// With include_stop (vLLM's include_stop_str_in_output) the text ends with the stop string
// instead of before it. stop() names the stop string that ended the text.
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
             bool include_stop = false);

  // Adds a generated token; returns the text released by it (often empty). After a stop string
  // appears, stopped() is true and the text ends before it; further tokens are ignored.
  std::string Add(int64_t token);
  // The end of generation: releases what was held back (it was no stop string after all).
  std::string Finish();
  bool stopped() const { return stopped_; }
  // The stop string that ended the text (the one that begins first; of two that begin at the
  // same place, the first given); empty while none has.
  const std::string& stop() const { return stop_; }
  const std::string& text() const { return released_; }

 private:
  // Decodes every token so far and releases what is safe (everything when `final`).
  std::string Release(bool final);

  Decode decode_;
  std::vector<std::string> stops_;
  int64_t min_tokens_;
  bool include_stop_;
  // The text while there are at most min_tokens tokens (then: of the first min_tokens).
  std::string first_text_;
  std::vector<int32_t> tokens_;
  std::string released_;
  bool stopped_ = false;
  std::string stop_;
};

}  // namespace colony::api
