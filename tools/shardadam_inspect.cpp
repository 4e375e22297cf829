// tools/shardadam_inspect.cpp — `shardadam-inspect [--json] [--headers-only] FILE...`:
// what a set of shard files holds and whether it is whole. Prints, per file, whether its
// header parses and its checksums match; per global tensor, its shape, dtype, the boxes
// saved and whether they cover it exactly once (or the gap/overlap). Exit status: 0 when
// everything is whole, 1 when something is wrong, 2 for a usage error or an unopenable file.
//
// It is a client of the C ABI (sa_inspect) like any other: the report is sa_inspect's JSON.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardadam/shardadam.h"

namespace {

using nlohmann::json;

std::string dims(const json& d) {
  std::string out = "[";
  for (std::size_t i = 0; i < d.size(); ++i)
    out += (i ? ", " : "") + std::to_string(d[i].get<int64_t>());
  return out + "]";
}

std::string size_text(uint64_t bytes) {
  char text[64];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return text;
}

void print_summary(const json& r) {
  const json& files = r["files"];
  std::printf("%zu shard file(s)\n", files.size());
  for (const json& f : files) {
    std::printf("  file %d: %s, %s: ", f["index"].get<int>(), f["name"].get<std::string>().c_str(),
                size_text(f["bytes"].get<uint64_t>()).c_str());
    if (f["header"] != "ok") {
      std::printf("header BAD\n      %s\n", f["error"].get<std::string>().c_str());
      continue;
    }
    std::string meshes;
    for (const json& m : f["meshes"])
      meshes += ", mesh " + dims(m["shape"]) + " coord " + dims(m["coord"]);
    std::printf("header ok, checksums %s (%s, %zu tensors%s)\n",
                f["checksums"].get<std::string>().c_str(), f["library"].get<std::string>().c_str(),
                f["tensors"].get<std::size_t>(), meshes.c_str());
    if (f.contains("error")) std::printf("      %s\n", f["error"].get<std::string>().c_str());
    if (f.contains("bad_block_list"))
      for (const json& b : f["bad_block_list"])
        std::printf("      bad block %llu of '%s'\n",
                    static_cast<unsigned long long>(b["block"].get<uint64_t>()),
                    b["tensor"].get<std::string>().c_str());
  }
  std::printf("groups: %s\n", r["groups"].get<std::string>().c_str());
  for (const json& f : files) {
    if (f["header"] != "ok") continue;
    for (std::size_t g = 0; g < f["groups"].size(); ++g) {
      const json& c = f["groups"][g];
      // Every hyperparameter the library knows, in its table's order and spelling.
      std::string fields;
      for (int32_t i = 0; i < sa_group_config_num_fields(); ++i) {
        sa_field_info info = SA_FIELD_INFO_INIT;
        if (sa_group_config_field(i, &info) != SA_OK || !c.contains(info.name)) continue;
        char value[64];
        std::snprintf(value, sizeof value, ", %s %g", info.name, c[info.name].get<double>());
        fields += value;
      }
      std::printf("  group %zu: step %lld%s\n", g, static_cast<long long>(c["step"].get<int64_t>()),
                  fields.c_str());
    }
    break;  // the groups of one file; "groups:" above says whether the others agree
  }
  std::printf("%zu global tensor(s)\n", r["tensors"].size());
  for (const json& t : r["tensors"]) {
    std::string dtypes;
    for (const json& d : t["dtypes"]) dtypes += (dtypes.empty() ? "" : "+") + d.get<std::string>();
    if (t.contains("block_scales"))
      dtypes += " codes, F32 absmax per " +
                std::to_string(t["block_scales"]["block_elems"].get<int64_t>()) + " in " +
                t["block_scales"]["key"].get<std::string>();
    const bool exact = t["coverage"] == "exact";
    std::printf("  %s: global shape %s, %s, %zu box(es): %s\n",
                t["name"].get<std::string>().c_str(), dims(t["global_shape"]).c_str(),
                dtypes.c_str(), t["boxes"].size(),
                exact ? "covered exactly once"
                      : ("NOT WHOLE (" + t["coverage"].get<std::string>() + ")").c_str());
    if (exact) continue;
    std::printf("      %s\n", t["detail"].get<std::string>().c_str());
    for (const json& b : t["boxes"])
      std::printf("      file %d: offset %s shape %s\n", b["file"].get<int>(),
                  dims(b["offset"]).c_str(), dims(b["shape"]).c_str());
  }
  std::printf("%s\n", r["ok"] == true
                          ? "OK: every file is sound and every tensor is covered exactly once"
                          : "PROBLEMS FOUND (see above)");
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--json] [--headers-only] FILE...\n"
               "  Lists what a set of shardadam shard files holds and checks that it is whole:\n"
               "  every header parses, every checksum matches, every global tensor is covered\n"
               "  exactly once. Exit status 0: whole; 1: problems found; 2: usage or open error.\n"
               "  --json          print sa_inspect's JSON report instead of the summary\n"
               "  --headers-only  do not read the data (skips the checksums)\n",
               self);
  return 2;
}

int run(int argc, char** argv) {
  bool as_json = false, verify = true;
  std::vector<const char*> paths;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      as_json = true;
    } else if (std::strcmp(argv[i], "--headers-only") == 0) {
      verify = false;
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0 ||
               (argv[i][0] == '-' && argv[i][1] != '\0')) {
      return usage(argv[0]);
    } else {
      paths.push_back(argv[i]);
    }
  }
  if (paths.empty()) return usage(argv[0]);

  std::vector<sa_reader> readers(paths.size());
  std::vector<const sa_reader*> pointers;
  int status = 0;
  for (std::size_t i = 0; i < paths.size() && status == 0; ++i) {
    if (sa_file_reader(paths[i], &readers[i]) != SA_OK) {
      std::fprintf(stderr, "shardadam-inspect: %s\n", sa_last_error());
      status = 2;
    }
    pointers.push_back(&readers[i]);
  }
  char* report = nullptr;
  if (status == 0 && sa_inspect(static_cast<int32_t>(pointers.size()), pointers.data(),
                                verify ? 1 : 0, &report) != SA_OK) {
    std::fprintf(stderr, "shardadam-inspect: %s\n", sa_last_error());
    status = 2;
  }
  if (status == 0) {
    const json r = json::parse(report);
    if (as_json) {
      std::printf("%s\n", report);
    } else {
      print_summary(r);
    }
    status = r["ok"] == true ? 0 : 1;
  }
  sa_free(report);
  for (sa_reader& r : readers) sa_reader_release(&r);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // out of host memory, in practice
    std::fprintf(stderr, "shardadam-inspect: %s\n", e.what());
    return 2;
  }
}
