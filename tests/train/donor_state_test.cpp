// A state donor's metadata parsed as hostile input: what a newcomer accepts before it downloads
// a state, and what it refuses (with the field named).
#include "train/donor_state.h"

#include <gtest/gtest.h>

#include <string>

namespace colony::train {
namespace {

std::string Meta(const std::string& tensors, const std::string& extra = "") {
  return R"({"run_id":"run","epoch":7,"inner_step":3,"diverged":false,"tensors":)" + tensors +
         extra + "}";
}

void ExpectRefused(const std::string& metadata, const std::string& why) {
  auto r = ParseDonorState(metadata, "run");
  ASSERT_FALSE(r.ok()) << metadata;
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
}

TEST(DonorState, AcceptsWhatAPeerWrites) {
  auto r = ParseDonorState(Meta(R"([{"name":"param.0","dtype":"Float","shape":[4,8]},)"
                                R"({"name":"opt.step","dtype":"Long","shape":[]}])"),
                           "run");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch, 7);
  EXPECT_EQ(r->inner_step, 3);
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].numel, 32);
  EXPECT_EQ(r->tensors[1].numel, 1);  // a scalar
  EXPECT_EQ(r->tensors[1].dtype, "Long");
}

TEST(DonorState, RefusesHostileMetadata) {
  ExpectRefused("not json", "malformed");
  ExpectRefused(Meta("[]", R"(,"surprise":1)"), "unknown field 'surprise'");
  ExpectRefused(R"({"run_id":"other","epoch":1,"inner_step":0,"diverged":false,"tensors":[]})",
                "another run");
  ExpectRefused(R"({"run_id":"run","epoch":-1,"inner_step":0,"diverged":false,"tensors":[]})",
                "negative epoch");
  // 2^64 - 1 reads as -1: refused, not wrapped into a huge epoch.
  ExpectRefused(
      R"({"run_id":"run","epoch":18446744073709551615,"inner_step":0,"diverged":false,"tensors":[]})",
      "negative epoch");
  ExpectRefused(Meta(R"([{"name":"p","dtype":"Quantum","shape":[1]}])"), "unknown dtype");
  ExpectRefused(Meta(R"([{"name":"p","dtype":"Float","shape":[-1]}])"), "bad shape");
  // Each dimension is allowed (2^40), their product is not; without the check it overflowed.
  ExpectRefused(Meta(R"([{"name":"p","dtype":"Float","shape":[1099511627776,1099511627776,16]}])"),
                "too large");
  ExpectRefused(Meta(R"([{"name":"p","dtype":"Float","shape":[1,1,1,1,1,1,1,1,1]}])"),
                "too many dimensions");
  ExpectRefused(Meta(R"([{"name":")" + std::string(300, 'x') + R"(","dtype":"Float","shape":[]}])"),
                "overlong name");
  ExpectRefused(Meta(R"([{"name":"p","shape":[1]}])"), "needs a name, a dtype and a shape");
}

}  // namespace
}  // namespace colony::train
