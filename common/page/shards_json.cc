#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "common/page/page.h"

namespace tally {

std::string PageJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string JobShardsJson(const std::vector<v1::ShardInfo>& shards,
                          const std::string& job_id) {
  // Each entry through protobuf's JSON printer: every string escaped.
  std::string out = "[";
  for (const v1::ShardInfo& s : shards) {
    for (const auto& r : s.ranges()) {
      if (r.job_id() != job_id) continue;
      v1::ShardInfo one;
      one.set_shard_id(s.shard_id());
      one.set_address(s.address());
      one.set_live(s.live());
      std::string entry = PageJson(one);
      entry.pop_back();
      absl::StrAppend(&out, out.size() > 1 ? "," : "", entry,
                      ",\"offset\":", r.offset(), ",\"count\":", r.count(),
                      ",\"version\":", r.version(), "}");
    }
  }
  return out + "]";
}

}  // namespace tally
