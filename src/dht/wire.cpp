#include "dht/wire.h"

#include <fmt/format.h>

#include <cmath>

#include "core/multiaddr.h"
#include "dht/dht.pb.h"

namespace colony::dht {
namespace {

namespace pb = colony::dht::proto;

template <typename P>
Status Parse(P& p, std::string_view bytes, const char* what) {
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError(fmt::format("malformed DHT {} ({} bytes)", what, bytes.size()));
  }
  return Status::Ok();
}

template <typename P>
std::string Serialize(const P& p) {
  std::string out;
  p.SerializeToString(&out);
  return out;
}

void EncodeHeader(const NodeHeader& h, pb::NodeHeader* out) {
  out->set_client_mode(h.client_mode);
  for (const std::string& a : h.addrs) out->add_addrs(a);
}

Result<std::vector<std::string>> DecodeAddrs(
    const google::protobuf::RepeatedPtrField<std::string>& in) {
  if (static_cast<size_t>(in.size()) > kMaxAddrsPerContact) {
    return ProtocolError(
        fmt::format("{} addresses for one peer (at most {})", in.size(), kMaxAddrsPerContact));
  }
  std::vector<std::string> out;
  for (const std::string& a : in) {
    if (a.size() > kMaxAddrBytes) return ProtocolError("address longer than 256 bytes");
    auto m = Multiaddr::Parse(a);
    if (!m.ok()) return ProtocolError("bad address: " + m.status().message());
    out.push_back(a);
  }
  return out;
}

Result<NodeHeader> DecodeHeader(const pb::NodeHeader& h) {
  NodeHeader out;
  out.client_mode = h.client_mode();
  COLONY_ASSIGN_OR_RETURN(out.addrs, DecodeAddrs(h.addrs()));
  return out;
}

Status CheckExpiration(double e) {
  if (!std::isfinite(e)) return ProtocolError("expiration is not finite");
  return Status::Ok();
}

}  // namespace

std::string EncodePingRequest(const PingRequest& m) {
  pb::PingRequest p;
  EncodeHeader(m.sender, p.mutable_sender());
  p.set_wall_time(m.wall_time);
  return Serialize(p);
}

std::string EncodePingResponse(const PingResponse& m) {
  pb::PingResponse p;
  p.set_wall_time(m.wall_time);
  p.set_client_mode(m.client_mode);
  return Serialize(p);
}

std::string EncodeStoreRequest(const StoreRequest& m) {
  pb::StoreRequest p;
  EncodeHeader(m.sender, p.mutable_sender());
  for (const StoreRequestItem& ri : m.items) {
    pb::StoreItem* i = p.add_items();
    i->set_key(ri.item.key);
    i->set_has_subkey(ri.item.subkey.has_value());
    if (ri.item.subkey) i->set_subkey(*ri.item.subkey);
    i->set_value(ri.item.value);
    i->set_expiration(ri.item.expiration);
    i->set_in_cache(ri.in_cache);
  }
  return Serialize(p);
}

std::string EncodeStoreResponse(const StoreResponse& m) {
  pb::StoreResponse p;
  for (const Status& st : m.results) {
    pb::StoreResult* r = p.add_results();
    r->set_code(static_cast<uint32_t>(st.code()));
    r->set_message(st.message().substr(0, 1024));
  }
  return Serialize(p);
}

std::string EncodeFindRequest(const FindRequest& m) {
  pb::FindRequest p;
  EncodeHeader(m.sender, p.mutable_sender());
  for (const DhtId& id : m.ids) p.add_ids(id.bytes().data(), id.bytes().size());
  return Serialize(p);
}

std::string EncodeFindResponse(const FindResponse& m) {
  pb::FindResponse p;
  for (const FindResult& r : m.results) {
    pb::FindResult* out = p.add_results();
    if (r.record) {
      pb::Record* rec = out->mutable_record();
      rec->set_is_dict(r.record->is_dict);
      if (r.record->is_dict) {
        for (const auto& [sub, v] : r.record->subkeys) {
          pb::Entry* e = rec->add_entries();
          e->set_subkey(sub);
          e->set_value(v.value);
          e->set_expiration(v.expiration);
        }
      } else {
        pb::Entry* e = rec->add_entries();
        e->set_value(r.record->value.value);
        e->set_expiration(r.record->value.expiration);
      }
    }
    for (const Contact& c : r.nearest) {
      pb::Contact* pc = out->add_nearest();
      Bytes id = c.peer.ToBytes();
      pc->set_peer_id(id.data(), id.size());
      for (const std::string& a : c.addrs) pc->add_addrs(a);
    }
  }
  return Serialize(p);
}

Result<PingRequest> DecodePingRequest(std::string_view bytes) {
  pb::PingRequest p;
  COLONY_RETURN_IF_ERROR(Parse(p, bytes, "ping request"));
  PingRequest out;
  COLONY_ASSIGN_OR_RETURN(out.sender, DecodeHeader(p.sender()));
  out.wall_time = p.wall_time();
  return out;
}

Result<PingResponse> DecodePingResponse(std::string_view bytes) {
  pb::PingResponse p;
  COLONY_RETURN_IF_ERROR(Parse(p, bytes, "ping response"));
  PingResponse out;
  out.wall_time = p.wall_time();
  out.client_mode = p.client_mode();
  return out;
}

Result<StoreRequest> DecodeStoreRequest(std::string_view bytes) {
  pb::StoreRequest p;
  COLONY_RETURN_IF_ERROR(Parse(p, bytes, "store request"));
  if (static_cast<size_t>(p.items_size()) > kMaxStoreItems) {
    return ProtocolError(
        fmt::format("store request has {} items (at most {})", p.items_size(), kMaxStoreItems));
  }
  StoreRequest out;
  COLONY_ASSIGN_OR_RETURN(out.sender, DecodeHeader(p.sender()));
  for (const pb::StoreItem& i : p.items()) {
    if (i.key().size() > kMaxWireKeyBytes || i.subkey().size() > kMaxWireKeyBytes ||
        i.value().size() > kMaxWireValueBytes) {
      return ProtocolError("store item key, subkey or value too large");
    }
    if (!i.has_subkey() && !i.subkey().empty()) {
      return ProtocolError("store item has a subkey but has_subkey is false");
    }
    COLONY_RETURN_IF_ERROR(CheckExpiration(i.expiration()));
    StoreRequestItem item;
    item.item.key = i.key();
    if (i.has_subkey()) item.item.subkey = i.subkey();
    item.item.value = i.value();
    item.item.expiration = i.expiration();
    item.in_cache = i.in_cache();
    out.items.push_back(std::move(item));
  }
  return out;
}

Result<StoreResponse> DecodeStoreResponse(std::string_view bytes, size_t expected_results) {
  pb::StoreResponse p;
  COLONY_RETURN_IF_ERROR(Parse(p, bytes, "store response"));
  if (static_cast<size_t>(p.results_size()) != expected_results) {
    return ProtocolError(fmt::format("store response has {} results for {} items", p.results_size(),
                                     expected_results));
  }
  StoreResponse out;
  for (const pb::StoreResult& r : p.results()) {
    if (r.code() > static_cast<uint32_t>(StatusCode::kProtocolError)) {
      return ProtocolError(fmt::format("store response has unknown status code {}", r.code()));
    }
    const auto code = static_cast<StatusCode>(r.code());
    // A remote peer's text: keep it printable so it cannot inject terminal escapes.
    std::string text = r.message().substr(0, 1024);
    for (char& c : text) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    out.results.push_back(code == StatusCode::kOk ? Status::Ok() : Status(code, std::move(text)));
  }
  return out;
}

Result<FindRequest> DecodeFindRequest(std::string_view bytes) {
  pb::FindRequest p;
  COLONY_RETURN_IF_ERROR(Parse(p, bytes, "find request"));
  if (p.ids_size() == 0 || static_cast<size_t>(p.ids_size()) > kMaxFindIds) {
    return ProtocolError(
        fmt::format("find request has {} ids (1 to {})", p.ids_size(), kMaxFindIds));
  }
  FindRequest out;
  COLONY_ASSIGN_OR_RETURN(out.sender, DecodeHeader(p.sender()));
  for (const std::string& id : p.ids()) {
    auto d = DhtId::FromBytes(AsBytes(id));
    if (!d.ok()) return ProtocolError("find request: " + d.status().message());
    out.ids.push_back(*d);
  }
  return out;
}

Result<FindResponse> DecodeFindResponse(std::string_view bytes, size_t expected_results) {
  pb::FindResponse p;
  COLONY_RETURN_IF_ERROR(Parse(p, bytes, "find response"));
  if (static_cast<size_t>(p.results_size()) != expected_results) {
    return ProtocolError(
        fmt::format("find response has {} results for {} ids", p.results_size(), expected_results));
  }
  FindResponse out;
  for (const pb::FindResult& r : p.results()) {
    FindResult result;
    if (r.has_record()) {
      const pb::Record& rec = r.record();
      Record record;
      record.is_dict = rec.is_dict();
      if (!rec.is_dict() && rec.entries_size() != 1) {
        return ProtocolError("plain record must have exactly one entry");
      }
      if (static_cast<size_t>(rec.entries_size()) > kMaxWireSubkeys) {
        return ProtocolError("record has too many subkeys");
      }
      for (const pb::Entry& e : rec.entries()) {
        COLONY_RETURN_IF_ERROR(CheckExpiration(e.expiration()));
        if (e.subkey().size() > kMaxWireKeyBytes || e.value().size() > kMaxWireValueBytes) {
          return ProtocolError("record entry too large");
        }
        if (!rec.is_dict()) {
          if (!e.subkey().empty()) return ProtocolError("plain record entry has a subkey");
          record.value = {e.value(), e.expiration()};
        } else if (!record.subkeys.emplace(e.subkey(), ValueEntry{e.value(), e.expiration()})
                        .second) {
          return ProtocolError("record repeats a subkey");
        }
      }
      result.record = std::move(record);
    }
    if (static_cast<size_t>(r.nearest_size()) > kMaxContactsPerResult) {
      return ProtocolError(fmt::format("find result lists {} peers (at most {})", r.nearest_size(),
                                       kMaxContactsPerResult));
    }
    for (const pb::Contact& c : r.nearest()) {
      auto peer = PeerId::FromBytes(AsBytes(c.peer_id()));
      if (!peer.ok()) return ProtocolError("find result: bad peer id: " + peer.status().message());
      Contact contact{*peer, DhtId::ForPeer(*peer), {}};
      COLONY_ASSIGN_OR_RETURN(contact.addrs, DecodeAddrs(c.addrs()));
      result.nearest.push_back(std::move(contact));
    }
    out.results.push_back(std::move(result));
  }
  return out;
}

}  // namespace colony::dht
