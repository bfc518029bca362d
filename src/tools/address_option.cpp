// The check every address option of the CLI shares (see commands.h).
#include "core/multiaddr.h"
#include "tools/commands.h"

namespace colony::cli {

CLI::Validator MultiaddrCheck() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        auto address = Multiaddr::Parse(text);
        return address.ok() ? std::string() : address.status().message();
      },
      "MULTIADDR", "multiaddr");
}

}  // namespace colony::cli
