// Tests of the model layer: safetensors I/O (including hostile headers), the Llama decoder
// (causality, KV cache, GQA, tying, learning, generation), checkpoints and the classifier.
// Models are tiny so that the whole binary runs in a few seconds on one core.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/classifier.h"
#include "model/llama.h"
#include "model/mixture.h"
#include "model/projection.h"
#include "model/rotary.h"
#include "model/safetensors.h"
#include "test_support.h"

namespace colony::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using colony::test::TempDir;

LlamaConfig TinyConfig() {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_seq_len = 64;
  return c;
}

torch::Tensor RandomTokens(int64_t b, int64_t t, int64_t vocab) {
  return at::randint(vocab, {b, t}, at::TensorOptions().dtype(at::kLong));
}

// ------------------------------------------------------------------------------------------
// safetensors

std::vector<uint8_t> FileBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file whose header is `header_json` followed by `data_size` zero bytes.
std::vector<uint8_t> MakeFile(const std::string& header_json, size_t data_size = 0) {
  std::vector<uint8_t> out(8);
  const uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header_json.begin(), header_json.end());
  out.resize(out.size() + data_size, 0);
  return out;
}

Status ParseError(const std::vector<uint8_t>& file) {
  auto r = ParseSafetensorsHeader(file, file.size());
  return r.ok() ? Status::Ok() : r.status();
}

TEST(Safetensors, RoundTripAllDTypes) {
  TempDir dir;
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI64,  DType::kI32,
                       DType::kI16, DType::kI8,  DType::kU8,   DType::kBool, DType::kF64};
  const std::vector<std::vector<int64_t>> shapes = {{3}, {2, 3}, {}, {0, 5}, {1, 2, 2}};
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < std::size(all); ++i) {
    TensorInfo info;
    info.name = "t" + std::to_string(i) + "." + std::string(DTypeName(all[i]));
    info.dtype = all[i];
    info.shape = shapes[i % shapes.size()];
    size_t n = DTypeSize(all[i]);
    for (int64_t d : info.shape) n *= static_cast<size_t>(d);
    std::vector<uint8_t> bytes(n);
    for (size_t j = 0; j < n; ++j) bytes[j] = static_cast<uint8_t>(i * 31 + j * 7);
    buffers.push_back(std::move(bytes));
    tensors.emplace_back(std::move(info), std::span<const uint8_t>());
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].second = buffers[i];
  const fs::path file = dir.path() / "all.safetensors";
  ASSERT_TRUE(WriteSafetensors(file, tensors, {{"format", "pt"}, {"step", "12"}}).ok());

  auto f = SafetensorsFile::Open(file);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header().data_offset % 8, 0u);
  EXPECT_EQ(f->header().metadata.at("format"), "pt");
  EXPECT_EQ(f->header().metadata.at("step"), "12");
  ASSERT_EQ(f->header().tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo* info = f->Find(tensors[i].first.name);
    ASSERT_NE(info, nullptr) << tensors[i].first.name;
    EXPECT_EQ(info->dtype, tensors[i].first.dtype);
    EXPECT_EQ(info->shape, tensors[i].first.shape);
    auto raw = f->ReadRaw(tensors[i].first.name);
    ASSERT_TRUE(raw.ok());
    EXPECT_EQ(*raw, buffers[i]) << tensors[i].first.name;
    EXPECT_EQ(ParseDType(DTypeName(tensors[i].first.dtype)).value(), tensors[i].first.dtype);
  }
  EXPECT_EQ(f->ReadRaw("nope").status().code(), StatusCode::kNotFound);
  // The parser accepts what the writer wrote, from bytes too.
  auto bytes = FileBytes(file);
  EXPECT_TRUE(ParseSafetensorsHeader(bytes, bytes.size()).ok());
  // Nothing but the file is left behind (the temporary was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  std::vector<uint8_t> four(4);
  TensorInfo info{"w", DType::kF32, {2}, 0, 0};
  EXPECT_FALSE(WriteSafetensors(dir.path() / "a", {{info, four}}).ok());  // 4 bytes != 8
  info.shape = {1};
  EXPECT_FALSE(WriteSafetensors(dir.path() / "b", {{info, four}, {info, four}}).ok());  // dup
  info.name = "__metadata__";
  EXPECT_FALSE(WriteSafetensors(dir.path() / "c", {{info, four}}).ok());
  EXPECT_FALSE(fs::exists(dir.path() / "a"));
}

TEST(Safetensors, HostileHeadersRejected) {
  struct Case {
    const char* what;
    std::vector<uint8_t> file;
    const char* message;  // substring of the error
  };
  std::vector<uint8_t> huge = MakeFile("{}");
  huge[5] = 1;  // length 2^40
  std::vector<uint8_t> past_end = MakeFile("{}");
  past_end[0] = 200;
  const std::string w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<Case> cases = {
      {"empty", {}, "too short"},
      {"short", {1, 0, 0}, "too short"},
      {"huge length", huge, "exceeds the limit"},
      {"length past end", past_end, "past the end"},
      {"not json", MakeFile("{not json}"), "not valid JSON"},
      {"array", MakeFile("[1,2]  "), "not a JSON object"},
      {"bad dtype", MakeFile(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
       "tensor 'w': unsupported dtype \"F128\""},
      {"negative dim", MakeFile(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})"),
       "tensor 'w': shape dimension -1"},
      {"fraction dim", MakeFile(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
       "shape dimension"},
      {"size mismatch", MakeFile(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}})", 8),
       "tensor 'w': data_offsets [0, 8) span 8 bytes but shape [2, 2] of F32 needs 16"},
      {"overflow",
       MakeFile(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"),
       "overflows"},
      {"out of range", MakeFile("{" + w + "}", 4), "beyond the 4-byte data section"},
      {"end before begin", MakeFile(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8),
       "end before they begin"},
      {"three offsets", MakeFile(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 4),
       "two non-negative integers"},
      {"missing dtype", MakeFile(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 4), "dtype"},
      {"overlap",
       MakeFile("{" + w + R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "overlap"},
      {"duplicate", MakeFile("{" + w + "," + w + "}", 8), "duplicate key \"w\""},
      {"metadata value", MakeFile(R"({"__metadata__":{"a":1}})"), "is not a string"},
      {"metadata type", MakeFile(R"({"__metadata__":[]})"), "__metadata__"},
      {"entry type", MakeFile(R"({"w":3})"), "tensor 'w': entry is not a JSON object"},
  };
  for (const Case& c : cases) {
    Status st = ParseError(c.file);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.what << ": " << st.message();
  }
  // A prefix shorter than the header is refused even when the file is long enough.
  auto good = MakeFile("{" + w + "}", 8);
  EXPECT_TRUE(ParseSafetensorsHeader(good, good.size()).ok());
  auto truncated = ParseSafetensorsHeader(std::span(good).first(good.size() - 9), good.size());
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);
  // Files on disk: Open reports the problem with the path.
  TempDir dir;
  auto bad = MakeFile("{" + w + "}", 4);
  std::ofstream(dir.path() / "bad.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(bad.data()), static_cast<std::streamsize>(bad.size()));
  auto f = SafetensorsFile::Open(dir.path() / "bad.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("bad.safetensors"), std::string::npos);
  EXPECT_EQ(SafetensorsFile::Open(dir.path() / "missing").status().code(), StatusCode::kNotFound);
}

TEST(Safetensors, ShardIndex) {
  TempDir dir;
  EXPECT_EQ(ReadShardIndex(dir.path()).status().code(), StatusCode::kNotFound);
  std::vector<uint8_t> four(4);
  ASSERT_TRUE(
      WriteSafetensors(dir.path() / "model.safetensors", {{{"a", DType::kF32, {1}, 0, 0}, four}})
          .ok());
  auto single = ReadShardIndex(dir.path());
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_EQ(single->at("a"), dir.path() / "model.safetensors");

  std::ofstream(dir.path() / kSafetensorsIndexFileName)
      << R"({"metadata":{"total_size":8},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})";
  auto sharded = ReadShardIndex(dir.path());
  ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
  EXPECT_EQ(sharded->size(), 2u);
  EXPECT_EQ(sharded->at("b"), dir.path() / "s2.safetensors");

  std::ofstream(dir.path() / kSafetensorsIndexFileName)
      << R"({"weight_map":{"a":"../../etc/passwd"}})";
  auto evil = ReadShardIndex(dir.path());
  ASSERT_FALSE(evil.ok());
  EXPECT_NE(evil.status().message().find("tensor 'a'"), std::string::npos);
}

// ------------------------------------------------------------------------------------------
// Llama config

TEST(LlamaConfig, JsonRoundTripAndValidation) {
  LlamaConfig c = TinyConfig();
  c.tie_word_embeddings = false;
  c.rope_theta = 500000;
  json j = c.ToJson();
  EXPECT_EQ(j["num_hidden_layers"], 2);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["model_type"], "llama");
  auto back = LlamaConfig::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);

  // HF defaults for optional fields.
  json minimal = {{"vocab_size", 100},
                  {"hidden_size", 64},
                  {"intermediate_size", 128},
                  {"num_hidden_layers", 2},
                  {"num_attention_heads", 4}};
  auto m = LlamaConfig::FromJson(minimal);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->num_kv_heads, 4);
  EXPECT_FALSE(m->tie_word_embeddings);
  EXPECT_EQ(m->max_seq_len, 2048);

  auto expect_error = [](json bad, const std::string& message) {
    auto r = LlamaConfig::FromJson(bad);
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  };
  expect_error(json{{"hidden_size", 64}}, "missing field \"vocab_size\"");
  json bad = minimal;
  bad["hidden_size"] = 66;
  expect_error(bad, "not divisible by num_attention_heads");
  bad = minimal;
  bad["num_key_value_heads"] = 3;
  expect_error(bad, "not divisible by num_key_value_heads");
  bad = minimal;
  bad["vocab_size"] = 0;
  expect_error(bad, "vocab_size = 0 is out of range");
  bad = minimal;
  bad["num_hidden_layers"] = 1000000;
  expect_error(bad, "num_hidden_layers");
  bad = minimal;
  bad["hidden_size"] = "64";
  expect_error(bad, "\"hidden_size\" must be an integer");
  bad = minimal;
  bad["rope_scaling"] = {{"type", "su"}, {"factor", 2.0}};
  expect_error(bad, "\"rope_scaling.rope_type\" = \"su\" is not supported");
  bad = minimal;
  bad["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}, {"finetuned", true}};
  expect_error(bad, "\"rope_scaling.finetuned\" = true is not understood");
  bad = minimal;
  bad["hidden_act"] = "gelu";
  expect_error(bad, "\"hidden_act\" = \"gelu\" is not supported");
  bad = minimal;
  bad["use_fancy_attention"] = true;
  expect_error(bad, "\"use_fancy_attention\" = true is not understood by Colony");
  bad = minimal;
  bad["attention_dropout"] = 0.1;
  expect_error(bad, "attention_dropout");
  bad = minimal;
  bad["rope_theta"] = 20000.0;
  bad["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  expect_error(bad, "disagrees");
  bad = minimal;
  bad["model_type"] = "gpt2";
  expect_error(bad, "\"model_type\" = \"gpt2\" is not supported");
  bad = minimal;
  bad["model_type"] = "qwen2";
  bad["num_key_value_heads"] = 2;
  bad["use_sliding_window"] = true;
  expect_error(bad, "use_sliding_window");
  bad = minimal;
  bad["rms_norm_eps"] = -1;
  expect_error(bad, "rms_norm_eps");
  bad = minimal;
  bad["hidden_size"] = 12;  // head_dim 3
  bad["num_attention_heads"] = 4;
  expect_error(bad, "must be even");
}

// The same model in transformers 4's layout (rope_theta, rope_scaling at the top level) and 5's
// (rope_parameters) reads the same, for every rope type; families take their own defaults.
TEST(LlamaConfig, BothTransformersLayoutsReadTheSame) {
  const json base = {{"vocab_size", 100},
                     {"hidden_size", 64},
                     {"intermediate_size", 128},
                     {"num_hidden_layers", 2},
                     {"num_attention_heads", 4},
                     {"num_key_value_heads", 2},
                     {"max_position_embeddings", 1024}};
  const std::vector<json> scalings = {
      {{"rope_type", "linear"}, {"factor", 4.0}},
      {{"rope_type", "dynamic"}, {"factor", 2.0}},
      {{"rope_type", "llama3"},
       {"factor", 8.0},
       {"low_freq_factor", 1.0},
       {"high_freq_factor", 4.0},
       {"original_max_position_embeddings", 256}},
      {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256}},
  };
  for (const json& scaling : scalings) {
    json v4 = base;
    v4["rope_theta"] = 500000.0;
    v4["rope_scaling"] = scaling;
    json v5 = base;
    v5["rope_parameters"] = scaling;
    v5["rope_parameters"]["rope_theta"] = 500000.0;
    auto a = LlamaConfig::FromJson(v4), b = LlamaConfig::FromJson(v5);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(*a, *b) << scaling.dump();
    EXPECT_EQ(a->rope_theta, 500000.0);
    EXPECT_EQ(RopeTypeName(a->rope_scaling.type), scaling["rope_type"].get<std::string>());
    auto back = LlamaConfig::FromJson(a->ToJson());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, *a);
  }
  json mixtral = base;
  mixtral["model_type"] = "mixtral";
  auto m = LlamaConfig::FromJson(mixtral);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->num_experts, 8);
  EXPECT_EQ(m->num_experts_per_tok, 2);
  EXPECT_EQ(m->rope_theta, 1e6);
  json mistral = base;
  mistral["model_type"] = "mistral";
  auto w = LlamaConfig::FromJson(mistral);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->sliding_window, 0);  // transformers' default of 4096 is past max_position 1024
  mistral["sliding_window"] = 16;
  w = LlamaConfig::FromJson(mistral);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->sliding_window, 16);
}

// Linear rope scaling by f at position p is the default rotation at p / f (an identity that does
// not depend on how Colony computes either).
TEST(Rotary, LinearScalingDividesPositions) {
  LlamaConfig plain = TinyConfig();
  LlamaConfig linear = plain;
  linear.rope_scaling.type = RopeType::kLinear;
  linear.rope_scaling.factor = 4;
  auto [cos_l, sin_l] = RotaryTables(linear, 1, 12, at::TensorOptions().dtype(at::kFloat));
  auto [cos_p, sin_p] = RotaryTables(plain, 1, 3, at::TensorOptions().dtype(at::kFloat));
  EXPECT_TRUE(at::allclose(cos_l, cos_p, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(sin_l, sin_p, 1e-5, 1e-6));
}

// A sliding window of W: the last position's output ignores every token W or more positions
// back, so changing those tokens changes nothing there, with and without the KV cache.
TEST(LlamaModel, SlidingWindowHidesOldTokens) {
  LlamaConfig c = TinyConfig();
  c.family = ModelFamily::kMistral;
  c.sliding_window = 3;
  at::manual_seed(3);
  LlamaModel model(c);
  model->eval();
  at::NoGradGuard no_grad;
  // One block: the last position sees positions 5..7 only (deeper blocks would widen it).
  auto block_out = [&](const at::Tensor& h) { return model->block(0)->forward(h)[0][-1]; };
  at::Tensor h = at::randn({1, 8, c.hidden_size});
  at::Tensor changed = h.clone();
  changed.narrow(1, 0, 5).normal_();
  EXPECT_TRUE(at::allclose(block_out(h), block_out(changed), 1e-5, 1e-6));
  at::Tensor nearer = h.clone();
  nearer.narrow(1, 5, 1).normal_();
  EXPECT_FALSE(at::allclose(block_out(h), block_out(nearer), 1e-5, 1e-6));
  // Cached decoding of the last position equals the full forward.
  KVCache cache;
  model->block(0)->forward(h.narrow(1, 0, 7), 0, &cache);
  at::Tensor step = model->block(0)->forward(h.narrow(1, 7, 1), 7, &cache)[0][-1];
  EXPECT_TRUE(at::allclose(step, block_out(h), 1e-5, 1e-5));
}

TEST(LlamaConfig, NumParametersMatchesModel) {
  for (bool tied : {true, false}) {
    LlamaConfig c = TinyConfig();
    c.tie_word_embeddings = tied;
    LlamaModel model(c);
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    EXPECT_EQ(n, c.NumParameters()) << "tied=" << tied;
  }
  LlamaConfig mixtral = TinyConfig();
  mixtral.family = ModelFamily::kMixtral;
  mixtral.num_experts = 3;
  mixtral.num_experts_per_tok = 2;
  mixtral.qkv_bias = mixtral.o_bias = true;
  mixtral.explicit_head_dim = 6;
  LlamaModel model(mixtral);
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, mixtral.NumParameters());
}

// A model whose experts are remote holds its routers and no expert, computes what the full model
// computes when a function supplies the experts (here the full model's own, standing in for
// servers), fails clearly without one, and cannot be saved.
TEST(LlamaModel, RemoteExpertsHoldNoExpertAndComputeTheSame) {
  LlamaConfig c = TinyConfig();
  c.family = ModelFamily::kMixtral;
  c.num_experts = 3;
  c.num_experts_per_tok = 2;
  at::manual_seed(4);
  LlamaModel full(c);
  LlamaConfig rc = c;
  rc.remote_experts = true;
  LlamaModel remote(rc);
  int64_t held = 0;
  for (const auto& p : remote->parameters()) held += p.numel();
  int64_t expert_params = 0;
  for (const auto& p : full->block(0)->block_sparse_moe->experts->parameters()) {
    expert_params += p.numel();
  }
  EXPECT_EQ(held, c.NumParameters() - c.num_layers * expert_params);
  // Copy every weight the remote model has (same names) from the full one.
  {
    torch::NoGradGuard no_grad;
    auto from = full->named_parameters();
    for (auto& item : remote->named_parameters()) item.value().copy_(from[item.key()]);
  }
  torch::NoGradGuard no_grad;
  const auto tokens = RandomTokens(2, 5, c.vocab_size);
  EXPECT_THROW(remote->forward(tokens), c10::Error);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto experts = full->block(l)->block_sparse_moe->experts;
    remote->block(l)->block_sparse_moe->set_expert_fn(
        [experts](int64_t e, const torch::Tensor& rows) mutable {
          return experts[static_cast<size_t>(e)]->as<ExpertMLP>()->forward(rows);
        });
  }
  EXPECT_TRUE(at::allclose(remote->forward(tokens), full->forward(tokens), 1e-5, 1e-6));
  TempDir dir;
  EXPECT_EQ(SaveLlama(dir.path(), remote).code(), StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------------------------------------
// Llama model

TEST(Llama, ForwardIsCausal) {
  at::manual_seed(1);
  LlamaModel model(TinyConfig());
  torch::NoGradGuard no_grad;
  auto tokens = RandomTokens(2, 10, 64);
  auto logits = model->forward(tokens);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 10, 64}));
  auto changed = tokens.clone();
  changed.index_put_({0, 6}, (tokens[0][6].item<int64_t>() + 1) % 64);
  changed.index_put_({1, 6}, (tokens[1][6].item<int64_t>() + 1) % 64);
  auto logits2 = model->forward(changed);
  EXPECT_TRUE(at::allclose(logits.narrow(1, 0, 6), logits2.narrow(1, 0, 6), 0, 1e-6));
  EXPECT_FALSE(at::allclose(logits.narrow(1, 6, 4), logits2.narrow(1, 6, 4), 0, 1e-4));
}

TEST(Llama, DeterministicInit) {
  at::manual_seed(42);
  LlamaModel a(TinyConfig());
  at::manual_seed(42);
  LlamaModel b(TinyConfig());
  auto pa = a->NamedParametersHF(), pb = b->NamedParametersHF();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].second.equal(pb[i].second));
  // Linear/embedding weights ~ N(0, 0.02).
  const double stddev = a->embed_tokens->weight.std().item<double>();
  EXPECT_NEAR(stddev, 0.02, 0.003);
}

TEST(Llama, IncrementalDecodingMatchesFullForward) {
  at::manual_seed(2);
  LlamaModel model(TinyConfig());
  torch::NoGradGuard no_grad;
  auto tokens = RandomTokens(2, 12, 64);
  auto full = model->forward(tokens);

  std::vector<KVCache> caches;
  std::vector<torch::Tensor> parts;
  parts.push_back(model->ForwardWithCache(tokens.narrow(1, 0, 5), caches));
  for (int64_t t = 5; t < 9; ++t)
    parts.push_back(model->ForwardWithCache(tokens.narrow(1, t, 1), caches));
  parts.push_back(model->ForwardWithCache(tokens.narrow(1, 9, 3), caches));
  auto incremental = at::cat(parts, 1);
  EXPECT_TRUE(at::allclose(incremental, full, 0, 1e-4))
      << (incremental - full).abs().max().item<float>();
  ASSERT_EQ(caches.size(), 2u);
  EXPECT_EQ(caches[1].length, 12);
  EXPECT_EQ(caches[1].k.sizes().vec(), (std::vector<int64_t>{2, 2, 12, 8}));

  // Per block, with explicit position offsets, as a server runs them.
  auto h = model->Embed(tokens);
  auto block = model->block(0);
  KVCache cache;
  auto first = block(h.narrow(1, 0, 7), 0, &cache);
  auto second = block(h.narrow(1, 7, 5), 7, &cache);
  EXPECT_TRUE(at::allclose(at::cat({first, second}, 1), block(h), 0, 1e-4));
}

// A pass computes the rotary tables once for all its blocks (LlamaModel, a server's RunBlocks):
// a block given them computes exactly what it computes with its own, uses them (tables for other
// positions change what new tokens see of the cached ones), and builds its own when they do not
// fit its input.
TEST(Llama, SharedRopeTablesAreUsedWhenTheyFitAndIgnoredOtherwise) {
  at::manual_seed(4);
  LlamaModel model(TinyConfig());
  torch::NoGradGuard no_grad;
  const auto x = model->Embed(RandomTokens(2, 6, 64));
  auto block = model->block(1);
  // Larger queries and keys than the initialisation's, so that attention depends on positions.
  block->self_attn->q_proj->weight.mul_(30);
  block->self_attn->k_proj->weight.mul_(30);
  KVCache cached;
  block(x.narrow(1, 0, 3), 0, &cached);
  auto next = [&](const RopeTables* rope) {
    KVCache cache = cached;  // appending replaces the tensors: `cached` stays as it is
    return block(x.narrow(1, 3, 3), 3, &cache, nullptr, rope);
  };
  const auto own = next(nullptr);
  const auto options = x.options();
  const RopeTables fitting = model->block(0)->Rope(3, 3, options);
  EXPECT_TRUE(at::equal(next(&fitting), own));
  const RopeTables elsewhere = model->block(0)->Rope(3, 10, options);
  EXPECT_FALSE(at::allclose(next(&elsewhere), own, 0, 1e-3));
  const RopeTables longer = model->block(0)->Rope(5, 3, options);
  const RopeTables in_double = model->block(0)->Rope(3, 3, options.dtype(at::kDouble));
  EXPECT_TRUE(at::equal(next(&longer), own));
  EXPECT_TRUE(at::equal(next(&in_double), own));
}

TEST(Llama, KVCacheReorder) {
  at::manual_seed(3);
  LlamaModel model(TinyConfig());
  torch::NoGradGuard no_grad;
  auto tokens = RandomTokens(2, 8, 64);
  std::vector<KVCache> caches;
  model->ForwardWithCache(tokens.narrow(1, 0, 7), caches);
  // Both beams continue from row 1.
  auto index = at::tensor(std::vector<int64_t>{1, 1});
  for (auto& c : caches) c.Reorder(index);
  auto next = tokens.narrow(1, 7, 1).index_select(0, index);
  auto step = model->ForwardWithCache(next, caches);
  auto full = model->forward(tokens.narrow(0, 1, 1));
  EXPECT_TRUE(at::allclose(step[0][0], full[0][7], 0, 1e-4));
  EXPECT_TRUE(at::allclose(step[1][0], full[0][7], 0, 1e-4));
}

// A cache holds exactly what was appended (against the concatenation of the pieces), fills its
// storage in place and doubles it when full (few storages over many one-token appends; one with
// `reserve`), and its copies behave as values: changing one (append after a rollback, reorder)
// leaves the other as it was.
TEST(Llama, KVCacheAppendsInPlaceAndCopiesAreValues) {
  at::manual_seed(5);
  const auto piece = [](int64_t b, int64_t t) { return at::randn({b, 2, t, 4}); };
  KVCache cache;
  std::vector<at::Tensor> ks, vs, alive;  // alive: no storage is freed, so none reuses an address
  std::set<const void*> storages;
  for (int i = 0; i < 100; ++i) {
    const int64_t t = i % 7 == 0 ? 3 : 1;
    ks.push_back(piece(2, t));
    vs.push_back(piece(2, t));
    cache.Append(ks.back(), vs.back());
    ASSERT_TRUE(at::equal(cache.k, at::cat(ks, 2))) << "append " << i;
    ASSERT_TRUE(at::equal(cache.v, at::cat(vs, 2))) << "append " << i;
    storages.insert(cache.k.storage().data());
    alive.push_back(cache.k);
  }
  EXPECT_EQ(cache.length, at::cat(ks, 2).size(2));
  EXPECT_LE(storages.size(), 9u);  // doubling: about log2(128) storages, not one per append
  EXPECT_GE(cache.capacity(), cache.length);

  KVCache reserved;
  reserved.reserve = 50;
  storages.clear();
  for (int i = 0; i < 50; ++i) {
    reserved.Append(piece(1, 1), piece(1, 1));
    storages.insert(reserved.k.storage().data());
    alive.push_back(reserved.k);
  }
  EXPECT_EQ(storages.size(), 1u);
  EXPECT_EQ(reserved.capacity(), 50);

  // Copies: the original rolls back and appends, the copy reorders; neither sees the other.
  KVCache a;
  a.Append(piece(2, 4), piece(2, 4));
  const at::Tensor a_k = a.k.clone();
  KVCache b = a;
  a.Truncate(2);
  const at::Tensor x = piece(2, 3);
  a.Append(x, x);
  EXPECT_TRUE(at::equal(b.k, a_k));
  EXPECT_TRUE(at::equal(a.k, at::cat({a_k.narrow(2, 0, 2), x}, 2)));
  const at::Tensor a_after = a.k.clone();
  b.Reorder(at::tensor(std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(at::equal(b.k, a_k.index_select(0, at::tensor(std::vector<int64_t>{1, 1}))));
  EXPECT_TRUE(at::equal(a.k, a_after));
  // A copy that reorders in place (same batch) leaves the cache it was copied from.
  KVCache c = a;
  c.Reorder(at::tensor(std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(at::equal(a.k, a_after));
  EXPECT_TRUE(at::equal(c.k, a_after.index_select(0, at::tensor(std::vector<int64_t>{1, 0}))));
  // Appending a batch of another size is refused, not broadcast into the cache.
  EXPECT_THROW(a.Append(piece(1, 1), piece(1, 1)), c10::Error);
  // Reordering into another batch size keeps the positions.
  b.Reorder(at::tensor(std::vector<int64_t>{0}));
  EXPECT_EQ(b.k.sizes().vec(), (std::vector<int64_t>{1, 2, 4, 4}));
  b.Append(piece(1, 1), piece(1, 1));
  EXPECT_EQ(b.length, 5);
}

// With autograd on, decoding through a cache stays differentiable: the gradients of two cached
// steps equal those of one pass over the whole sequence.
TEST(Llama, CachedStepsAreDifferentiable) {
  at::manual_seed(6);
  LlamaModel model(TinyConfig());
  auto block = model->block(0);
  const auto h = model->Embed(RandomTokens(2, 9, 64)).detach();
  const at::Tensor probe = at::randn({2, 9, TinyConfig().hidden_size});
  KVCache cache;
  cache.reserve = 16;  // room for both steps: the second would write into the first's storage
  auto stepped =
      at::cat({block(h.narrow(1, 0, 5), 0, &cache), block(h.narrow(1, 5, 4), 5, &cache)}, 1);
  (stepped * probe).sum().backward();
  const at::Tensor cached_grad = block->self_attn->k_proj->weight.grad().clone();
  block->zero_grad();
  (block(h) * probe).sum().backward();
  EXPECT_TRUE(at::allclose(cached_grad, block->self_attn->k_proj->weight.grad(), 1e-4, 1e-5));
}

TEST(Llama, GroupedQueryAttentionEqualsRepeatedHeads) {
  LlamaConfig gqa = TinyConfig();
  gqa.num_kv_heads = 2;  // query heads 0, 1 read kv head 0; 2, 3 read kv head 1
  LlamaConfig mha = gqa;
  mha.num_kv_heads = 4;
  at::manual_seed(4);
  LlamaModel a(gqa);
  LlamaModel b(mha);
  torch::NoGradGuard no_grad;
  const int64_t hd = gqa.head_dim(), h = gqa.hidden_size;
  EXPECT_EQ(a->block(0)->self_attn->k_proj->weight.sizes().vec(),
            (std::vector<int64_t>{gqa.num_kv_heads * hd, h}));
  // Copy a into b, repeating each kv head for the query heads that read it.
  auto pa = a->NamedParametersHF(), pb = b->NamedParametersHF();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].first, pb[i].first);
    auto src = pa[i].second;
    if (src.sizes() != pb[i].second.sizes()) {
      src = src.view({gqa.num_kv_heads, hd, h}).repeat_interleave(2, 0).reshape({-1, h});
    }
    pb[i].second.copy_(src);
  }
  auto tokens = RandomTokens(2, 9, 64);
  const at::Tensor reference = b->forward(tokens);
  EXPECT_TRUE(at::allclose(a->forward(tokens), reference, 0, 1e-5));
  // Also decoding through a cache, several tokens a step.
  std::vector<KVCache> caches;
  const at::Tensor first = a->ForwardWithCache(tokens.narrow(1, 0, 5), caches);
  const at::Tensor second = a->ForwardWithCache(tokens.narrow(1, 5, 4), caches);
  EXPECT_TRUE(at::allclose(at::cat({first, second}, 1), reference, 0, 1e-5));
}

TEST(Llama, TiedAndUntiedNames) {
  LlamaConfig c = TinyConfig();
  c.num_layers = 1;
  LlamaModel tied(c);
  std::vector<std::string> names;
  for (const auto& [name, t] : tied->NamedParametersHF()) names.push_back(name);
  const std::vector<std::string> expected = {
      "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.norm.weight",
  };
  EXPECT_EQ(names, expected);
  // Tied: the head reads the embedding matrix.
  torch::NoGradGuard no_grad;
  auto hidden = at::randn({1, 2, c.hidden_size});
  auto before = tied->Head(hidden);
  tied->embed_tokens->weight.mul_(2);
  EXPECT_TRUE(at::allclose(tied->Head(hidden), before * 2, 1e-5, 1e-6));

  c.tie_word_embeddings = false;
  LlamaModel untied(c);
  auto untied_names = untied->NamedParametersHF();
  EXPECT_EQ(untied_names.back().first, "lm_head.weight");
  EXPECT_EQ(untied_names.size(), expected.size() + 1);
  EXPECT_EQ(untied->forward(RandomTokens(1, 3, 64)).sizes().vec(),
            (std::vector<int64_t>{1, 3, 64}));
}

TEST(Llama, AdamReducesLoss) {
  at::manual_seed(5);
  LlamaConfig c = TinyConfig();
  c.num_layers = 1;
  LlamaModel model(c);
  // A short pattern repeated: easy to memorize.
  std::vector<int64_t> seq;
  for (int i = 0; i < 17; ++i) seq.push_back((i * 7) % 11 + 3);
  auto tokens = at::tensor(seq).unsqueeze(0).repeat({2, 1});
  auto inputs = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    auto loss = LanguageModelLoss(model->forward(inputs), targets);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(64.0), 0.3);  // ~uniform at init
  EXPECT_LT(last, first * 0.3) << first << " -> " << last;
}

TEST(Llama, GreedyGenerateMatchesFullForward) {
  at::manual_seed(6);
  LlamaModel model(TinyConfig());
  const std::vector<int64_t> prompt = {1, 5, 9, 2};
  SamplingOptions greedy;
  greedy.max_new_tokens = 10;
  auto out = Generate(model, prompt, greedy);
  ASSERT_EQ(out.size(), 10u);
  EXPECT_EQ(Generate(model, prompt, greedy), out);

  torch::NoGradGuard no_grad;
  std::vector<int64_t> seq = prompt;
  for (int64_t expected : out) {
    auto logits = model->forward(at::tensor(seq).unsqueeze(0));
    EXPECT_EQ(logits[0][-1].argmax().item<int64_t>(), expected);
    seq.push_back(expected);
  }
  // Stops after the first eos (included).
  const int64_t eos = out[5];
  auto eos_end = std::find(out.begin(), out.end(), eos) + 1;
  EXPECT_EQ(Generate(model, prompt, greedy, eos), std::vector<int64_t>(out.begin(), eos_end));
  // And at max_seq_len.
  SamplingOptions many = greedy;
  many.max_new_tokens = 1000;
  EXPECT_EQ(Generate(model, prompt, many).size(), 64u - prompt.size());
}

TEST(Llama, SeededSamplingIsReproducible) {
  at::manual_seed(7);
  LlamaModel model(TinyConfig());
  SamplingOptions opts;
  opts.max_new_tokens = 16;
  opts.temperature = 1.5;
  opts.top_k = 20;
  opts.top_p = 0.95;
  opts.repetition_penalty = 1.2;
  opts.seed = 11;
  const std::vector<int64_t> prompt = {3, 4};
  auto a = Generate(model, prompt, opts);
  EXPECT_EQ(Generate(model, prompt, opts), a);
  opts.seed = 12;
  EXPECT_NE(Generate(model, prompt, opts), a);
}

TEST(Sampling, Warpers) {
  std::mt19937_64 rng(1);
  auto logits = at::tensor(std::vector<float>{0.f, 2.f, 1.f, 1.9f});
  SamplingOptions opts;
  EXPECT_EQ(SampleNextToken(logits, {}, opts, rng), 1);
  // Repetition penalty: 2 / 1.5 < 1.9.
  opts.repetition_penalty = 1.5;
  EXPECT_EQ(SampleNextToken(logits, {1, 1}, opts, rng), 3);
  opts.repetition_penalty = 1;
  opts.temperature = 1;
  opts.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(SampleNextToken(logits, {}, opts, rng), 1);
  opts.top_k = 0;
  opts.top_p = 0.3;  // token 1 alone has ~0.38 of the mass
  for (int i = 0; i < 20; ++i) EXPECT_EQ(SampleNextToken(logits, {}, opts, rng), 1);
  // Frequencies follow the softmax: p(1) = 3/4 for logits {0, log 3}.
  opts.top_p = 1;
  auto two = at::tensor(std::vector<float>{0.f, static_cast<float>(std::log(3.0))});
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += SampleNextToken(two, {}, opts, rng) == 1;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

// ------------------------------------------------------------------------------------------
// Checkpoints

TEST(Checkpoint, SaveLoadLlamaRoundTrip) {
  TempDir dir;
  LlamaConfig c = TinyConfig();
  c.tie_word_embeddings = false;
  at::manual_seed(8);
  LlamaModel model(c);
  LlamaConfig other = c;
  other.rope_theta = 20000;
  EXPECT_EQ(SaveLlama(dir.path(), model, other).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(SaveLlama(dir.path(), model, c).ok());
  EXPECT_TRUE(fs::exists(dir.path() / "config.json"));
  auto loaded = LoadLlama(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->config(), c);
  torch::NoGradGuard no_grad;
  auto tokens = RandomTokens(2, 7, 64);
  EXPECT_TRUE(model->forward(tokens).equal((*loaded)->forward(tokens)));
  auto f = SafetensorsFile::Open(dir.path() / "model.safetensors");
  ASSERT_TRUE(f.ok());
  EXPECT_NE(f->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(f->header().metadata.at("format"), "pt");
}

TEST(Checkpoint, LoadLlamaBlocksReadsOnlyItsShards) {
  TempDir dir;
  LlamaConfig c = TinyConfig();
  c.num_layers = 3;
  at::manual_seed(9);
  LlamaModel model(c);
  ASSERT_TRUE(SaveLlama(dir.path(), model).ok());
  // Re-shard: embeddings and block 0 in one file, blocks 1-2 and the final norm in another.
  fs::remove(dir.path() / "model.safetensors");
  NamedTensors first, second;
  json weight_map;
  for (auto& [name, t] : model->NamedParametersHF()) {
    bool in_first =
        name.rfind("model.embed_tokens", 0) == 0 || name.rfind("model.layers.0.", 0) == 0;
    (in_first ? first : second).emplace_back(name, t);
    weight_map[name] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(SaveModule(dir.path() / "model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(SaveModule(dir.path() / "model-00002-of-00002.safetensors", second).ok());
  std::ofstream(dir.path() / kSafetensorsIndexFileName) << json{{"weight_map", weight_map}}.dump();

  ASSERT_TRUE(LoadLlama(dir.path()).ok());
  // Without the first shard, blocks 1-2 still load; the whole model does not.
  fs::remove(dir.path() / "model-00001-of-00002.safetensors");
  EXPECT_FALSE(LoadLlama(dir.path()).ok());
  auto range = LoadLlamaBlocks(dir.path(), 1, 3);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_EQ(range->first, 1);
  ASSERT_EQ(range->blocks.size(), 2u);
  torch::NoGradGuard no_grad;
  auto h = at::randn({1, 5, c.hidden_size});
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(range->blocks[static_cast<size_t>(i)](h).equal(model->block(1 + i)(h)));
  }
  EXPECT_FALSE(LoadLlamaBlocks(dir.path(), 2, 4).ok());
  EXPECT_FALSE(LoadLlamaBlocks(dir.path(), 0, 1).ok());  // its shard is gone
}

TEST(Checkpoint, LoadModuleChecksNamesShapesAndDTypes) {
  TempDir dir;
  const fs::path file = dir.path() / "m.safetensors";
  auto w = at::randn({3, 4});
  auto b = at::randn({4}).to(at::kBFloat16);
  auto steps = at::tensor(std::vector<int64_t>{7});
  ASSERT_TRUE(SaveModule(file, {{"w", w}, {"b", b}, {"steps", steps}}, {{"epoch", "3"}}).ok());

  auto w2 = at::zeros({3, 4});
  auto b2 = at::zeros({4});  // float32 destination for a BF16 tensor
  auto steps2 = at::zeros({1}, at::kLong);
  ASSERT_TRUE(LoadModule(file, {{"w", w2}, {"b", b2}, {"steps", steps2}}).ok());
  EXPECT_TRUE(w2.equal(w));
  EXPECT_TRUE(b2.equal(b.to(at::kFloat)));
  EXPECT_EQ(steps2.item<int64_t>(), 7);

  auto expect_error = [&](NamedTensors named, const std::string& message) {
    Status st = LoadModule(file, named);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(message), std::string::npos) << st.message();
  };
  expect_error({{"w", w2}, {"b", b2}}, "unexpected tensor 'steps'");
  expect_error({{"w", w2}, {"b", b2}, {"steps", steps2}, {"x", w2}}, "missing tensor 'x'");
  expect_error({{"w", at::zeros({4, 3})}, {"b", b2}, {"steps", steps2}}, "shape [3, 4]");
  expect_error({{"w", w2}, {"b", b2}, {"steps", at::zeros({1})}}, "I64");
  // Nothing was copied by the failed loads.
  auto untouched = at::zeros({3, 4});
  EXPECT_FALSE(LoadModule(file, {{"w", untouched}, {"b", b2}}).ok());
  EXPECT_TRUE(untouched.equal(at::zeros({3, 4})));
}

// ------------------------------------------------------------------------------------------
// Classifier

TEST(Classifier, ShapeAndLearning) {
  at::manual_seed(10);
  FashionClassifier model;
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_LT(n, 100'000);
  auto images = at::rand({16, 1, 28, 28});
  auto labels = at::randint(10, {16}, at::TensorOptions().dtype(at::kLong));
  EXPECT_EQ(model->forward(images).sizes().vec(), (std::vector<int64_t>{16, 10}));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 15; ++step) {
    opt.zero_grad();
    auto loss = at::cross_entropy_loss(model->forward(images), labels);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first * 0.7) << first << " -> " << last;

  // Its parameters round-trip through SaveModule / LoadModule.
  TempDir dir;
  ASSERT_TRUE(SaveModule(dir.path() / "c.safetensors", NamedParametersOf(*model)).ok());
  FashionClassifier other;
  ASSERT_TRUE(LoadModule(dir.path() / "c.safetensors", NamedParametersOf(*other)).ok());
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(other->forward(images).equal(model->forward(images)));
}

// The inverse of the standard normal CDF, by bisection on erfc (independent of any table).
double NormalQuantile(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// NF4's levels as QLoRA constructs them: 8 positive quantiles of a normal over [0.5, offset], 7
// negative ones, and 0, scaled so the largest is 1.
TEST(Nf4, LevelsAreTheNormalQuantilesQloraDefines) {
  constexpr double kOffset = 0.9677083;
  std::vector<double> v = {0.0};
  for (int i = 0; i < 8; ++i) v.push_back(NormalQuantile(kOffset + (0.5 - kOffset) * i / 8));
  for (int i = 0; i < 7; ++i) v.push_back(-NormalQuantile(kOffset + (0.5 - kOffset) * i / 7));
  std::sort(v.begin(), v.end());
  ASSERT_EQ(v.size(), kNf4Levels.size());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_NEAR(kNf4Levels[i], v[i] / v.back(), 1e-6) << "level " << i;
  }
}

// A buffer of the linear (undefined when it has none).
at::Tensor BufferOf(torch::nn::Linear& linear, const std::string& name) {
  const auto buffers = linear->named_buffers(/*recurse=*/false);
  const at::Tensor* t = buffers.find(name);
  return t != nullptr ? *t : at::Tensor();
}

// NF4 with double quantization, checked against what it approximates. The block scales: their
// offset is the mean of the blocks' absmax values, each group of 256 has its largest deviation
// from it / 127 as its scale, and each code is the nearest multiple of that. The weights: each is
// the level nearest to it (searched over all 16) over its block's decoded scale, rows whose
// length is no multiple of the block and an all-zero block included; the product equals the one
// with those weights; and a weight takes 4 bits plus its share of a byte per block.
TEST(Nf4, EachWeightIsTheNearestLevelOfItsBlock) {
  at::manual_seed(5);
  for (const auto& [in, out] : std::vector<std::pair<int64_t, int64_t>>{
           {176, 24}, {64, 3}, {7, 5}, {640, 40}}) {  // the last: 400 scales in 2 groups
    torch::nn::Linear linear = MakeLinear(in, out, /*bias=*/true);
    {
      torch::NoGradGuard no_grad;
      linear->weight.normal_(0, 1);
      linear->weight[0].narrow(0, 0, std::min<int64_t>(64, in)).zero_();
      linear->bias.normal_(0, 1);
    }
    const at::Tensor w = linear->weight.detach().clone();
    const at::Tensor x = at::randn({2, 3, in});
    QuantizeNf4(linear);
    EXPECT_EQ(linear->weight.scalar_type(), at::kByte);
    const int64_t blocks = (in + 63) / 64, groups = (out * blocks + 255) / 256;
    EXPECT_EQ(linear->weight.numel(), out * blocks * 32);
    const at::Tensor codes = BufferOf(linear, "weight_absmax").reshape({-1});
    const at::Tensor scales = BufferOf(linear, "weight_absmax_scale");
    const at::Tensor offset = BufferOf(linear, "weight_absmax_offset");
    ASSERT_TRUE(codes.defined() && scales.defined() && offset.defined());
    ASSERT_EQ(codes.scalar_type(), at::kChar);
    ASSERT_EQ(codes.numel(), out * blocks);
    ASSERT_EQ(scales.numel(), groups);
    ASSERT_EQ(offset.numel(), 1);
    // The blocks' absmax values, and their mean in double.
    std::vector<float> exact;
    double sum = 0;
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        exact.push_back(
            w[r].narrow(0, b * 64, std::min<int64_t>(64, in - b * 64)).abs().max().item<float>());
        sum += exact.back();
      }
    }
    const float mean = offset.item<float>();
    EXPECT_NEAR(mean, sum / static_cast<double>(exact.size()), 1e-6 * sum / exact.size());
    std::vector<float> decoded(exact.size());
    for (int64_t g = 0; g < groups; ++g) {
      double deviation = 0;
      for (int64_t k = g * 256; k < std::min<int64_t>((g + 1) * 256, out * blocks); ++k) {
        deviation = std::max<double>(deviation, std::abs(exact[k] - mean));
      }
      const float scale = scales[g].item<float>();
      EXPECT_NEAR(scale, std::max(deviation, 1e-12) / 127, 1e-6 * scale) << "group " << g;
      for (int64_t k = g * 256; k < std::min<int64_t>((g + 1) * 256, out * blocks); ++k) {
        const float code = codes[k].item<int8_t>();
        EXPECT_LE(std::abs(code * scale + mean - exact[k]), scale * 0.5001 + 1e-7) << "scale " << k;
        decoded[k] = std::max(code * scale + mean, 1e-12f);
      }
    }
    // The expected weight, by exhaustive search.
    at::Tensor want = at::empty({out, in});
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n = std::min<int64_t>(64, in - b * 64);
        const at::Tensor block = w[r].narrow(0, b * 64, n);
        const float absmax = decoded[r * blocks + b];
        for (int64_t i = 0; i < n; ++i) {
          const float v = block[i].item<float>() / absmax;
          float best = kNf4Levels[0];
          for (float level : kNf4Levels) {
            if (std::abs(v - level) < std::abs(v - best)) best = level;
          }
          want[r][b * 64 + i] = best * absmax;
        }
      }
    }
    const at::Tensor y = Project(linear, x, nullptr);
    const at::Tensor ref = at::linear(x, want, linear->bias);
    EXPECT_TRUE(at::allclose(y, ref, 1e-5, 1e-5))
        << in << "x" << out << ": " << (y - ref).abs().max().item<float>();
    EXPECT_FALSE(linear->weight.requires_grad());
    // The all-zero block stays zero.
    EXPECT_EQ(want[0].narrow(0, 0, std::min<int64_t>(64, in)).abs().max().item<float>(), 0.0f);
  }
  // A matrix over 4M weights is dequantized a band of rows at a time: the product is the same
  // as with the whole matrix unpacked here (high nibble first).
  torch::nn::Linear big = MakeLinear(64, 70000);
  const at::Tensor xb = at::randn({3, 64});
  QuantizeNf4(big);
  const at::Tensor codes = big->weight;
  const at::Tensor idx = at::stack({codes.__rshift__(4), codes.bitwise_and(15)}, -1)
                             .reshape({70000, 64})
                             .to(at::kLong);
  const at::Tensor levels = at::tensor(std::vector<float>(kNf4Levels.begin(), kNf4Levels.end()));
  const at::Tensor absmax =
      Nf4Absmax(BufferOf(big, "weight_absmax"), BufferOf(big, "weight_absmax_scale"),
                BufferOf(big, "weight_absmax_offset"));
  const at::Tensor whole = levels.index({idx}) * absmax;  // one block per row
  EXPECT_TRUE(at::allclose(Project(big, xb, nullptr), at::linear(xb, whole), 1e-5, 1e-5));

  EXPECT_EQ(*ParseWeightQuantization("nf4"), WeightQuantization::kNf4);
  EXPECT_EQ(*ParseWeightQuantization("int8"), WeightQuantization::kInt8);
  const auto bad = ParseWeightQuantization("fp4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'fp4'"), std::string::npos);
}

}  // namespace
}  // namespace colony::model
