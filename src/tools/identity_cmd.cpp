// colony identity new|show: create and inspect peer identity files.
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "core/identity.h"
#include "tools/commands.h"

namespace colony::cli {

void AddIdentityCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto* identity =
      app.add_subcommand("identity", "create or inspect a peer identity (Ed25519 key)");
  identity->require_subcommand(1);

  struct NewArgs {
    std::string out;
    bool force = false;
  };
  auto new_args = std::make_shared<NewArgs>();
  auto* create = identity->add_subcommand("new", "generate a new identity and save it (mode 0600)");
  create->add_option("--out", new_args->out, "file to write")->required();
  create->add_flag("--force", new_args->force, "overwrite an existing file");
  commands.emplace_back(create, [new_args] {
    KeyPair kp = KeyPair::Generate();
    if (Status st = kp.Save(new_args->out, new_args->force); !st.ok()) return Fail(st);
    std::printf("%s\n", kp.peer_id().ToString().c_str());
    std::fprintf(stderr, "wrote identity %s to %s (keep it private)\n",
                 kp.peer_id().ToString().c_str(), new_args->out.c_str());
    return 0;
  });

  auto show_path = std::make_shared<std::string>();
  auto* show = identity->add_subcommand("show", "print the peer id of an identity file");
  show->add_option("file", *show_path, "identity file")->required();
  commands.emplace_back(show, [show_path] {
    auto kp = KeyPair::Load(*show_path);
    if (!kp.ok()) return Fail(kp.status());
    struct stat st {};
    if (::stat(show_path->c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      std::fprintf(stderr, "colony: warning: %s is readable by other users; run 'chmod 600 %s'\n",
                   show_path->c_str(), show_path->c_str());
    }
    std::printf("%s\n", kp->peer_id().ToString().c_str());
    return 0;
  });
}

}  // namespace colony::cli
