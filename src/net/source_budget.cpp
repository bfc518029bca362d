// SourceBudget: a shared total with a cap per source, under one mutex.
#include "net/source_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace colony::net {

SourceBudget::Lease::Lease(Lease&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      source_(std::move(other.source_)),
      held_(std::exchange(other.held_, 0)) {}

SourceBudget::Lease& SourceBudget::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    source_ = std::move(other.source_);
    held_ = std::exchange(other.held_, 0);
  }
  return *this;
}

Status SourceBudget::Lease::Take(uint64_t n) {
  if (budget_ == nullptr) return FailedPrecondition("a budget lease that belongs to no budget");
  COLONY_RETURN_IF_ERROR(budget_->Take(source_, n));
  held_ += n;
  return Status::Ok();
}

void SourceBudget::Lease::Release() {
  if (budget_ != nullptr && held_ > 0) budget_->Give(source_, held_);
  held_ = 0;
}

Status SourceBudget::Take(const std::string& source, uint64_t n) {
  std::lock_guard lock(mu_);
  if (n > options_.limit || used_ > options_.limit - n) {
    ++refused_;
    return ResourceExhausted(
        fmt::format("{} holds its limit of {} {} ({} held); try again or use another server",
                    options_.holder, options_.limit, options_.unit, used_));
  }
  if (!source.empty()) {
    auto it = held_.find(source);
    const uint64_t mine = it == held_.end() ? 0 : it->second;
    if (mine > 0 && (n > options_.per_source || mine > options_.per_source - n)) {
      ++refused_;
      return ResourceExhausted(fmt::format(
          "{} holds {} {} on {} and one client address may hold {}; wait for those calls to end "
          "or use another server",
          source, mine, options_.unit, options_.holder, options_.per_source));
    }
    held_[source] = mine + n;
  }
  used_ += n;
  peak_ = std::max(peak_, used_);
  return Status::Ok();
}

void SourceBudget::Give(const std::string& source, uint64_t n) {
  std::lock_guard lock(mu_);
  used_ -= std::min(used_, n);
  if (source.empty()) return;
  auto it = held_.find(source);
  if (it == held_.end()) return;
  it->second -= std::min(it->second, n);
  if (it->second == 0) held_.erase(it);
}

uint64_t SourceBudget::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

uint64_t SourceBudget::peak() const {
  std::lock_guard lock(mu_);
  return peak_;
}

size_t SourceBudget::sources() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

uint64_t SourceBudget::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

}  // namespace colony::net
