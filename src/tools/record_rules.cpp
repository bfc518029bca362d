#include "tools/record_rules.h"

#include "averaging/key_families.h"
#include "moe/expert_records.h"
#include "serve/records.h"
#include "train/progress.h"

namespace colony::cli {

std::shared_ptr<const dht::RecordValidator> SwarmRecordRules() {
  std::vector<dht::KeyFamily> families = averaging::AveragingKeyFamilies();
  families.push_back(serve::ServerRecordFamily());
  families.push_back(serve::ModelsFamily());
  families.push_back(train::ProgressFamily());
  families.push_back(train::RunsFamily());
  families.push_back(moe::ExpertFamily());
  return std::make_shared<dht::KeyFamilyValidator>(std::move(families));
}

}  // namespace colony::cli
