// ObservedAddressBook: bounded, ranked by how many peers agree.
#include "net/observed_addresses.h"

#include <algorithm>

#include "core/multiaddr.h"

namespace colony::net {
namespace {

// Fewer reporters first, then older: the entry to drop is the first under this order.
template <typename E>
bool Weaker(const E& a, const E& b) {
  if (a.reporters.size() != b.reporters.size()) return a.reporters.size() < b.reporters.size();
  return a.last_seen < b.last_seen;
}

}  // namespace

void ObservedAddressBook::Add(const std::string& address, const PeerId& reporter) {
  auto parsed = Multiaddr::Parse(address);
  if (!parsed.ok() || !parsed->is_ip()) return;
  const std::string canonical = parsed->WithoutPeerId().ToString();
  ++tick_;
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.address == canonical; });
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxObservedAddresses) {
      auto weakest = std::min_element(entries_.begin(), entries_.end(),
                                      [](const Entry& a, const Entry& b) { return Weaker(a, b); });
      // A newcomer has one reporter: it never displaces an address more peers agree on.
      if (weakest->reporters.size() > 1) return;
      entries_.erase(weakest);
    }
    entries_.push_back({canonical, {}, 0});
    it = std::prev(entries_.end());
  }
  it->last_seen = tick_;
  if (std::find(it->reporters.begin(), it->reporters.end(), reporter) == it->reporters.end() &&
      it->reporters.size() < kMaxReportersPerAddress) {
    it->reporters.push_back(reporter);
  }
}

std::vector<std::string> ObservedAddressBook::Ranked() const {
  std::vector<const Entry*> order;
  order.reserve(entries_.size());
  for (const Entry& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const Entry* a, const Entry* b) { return Weaker(*b, *a); });
  std::vector<std::string> out;
  out.reserve(order.size());
  for (const Entry* e : order) out.push_back(e->address);
  return out;
}

}  // namespace colony::net
