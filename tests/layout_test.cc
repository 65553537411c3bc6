// The dependency rule of docs/design.md ("Rooms"), checked from the #include lines of
// every file under src/ and include/mlakv/, so the layout stays true as code lands.
//
// Rooms, lowest first; a room may include its own files and those of LOWER ranks only.
// Rooms of equal rank are siblings and may not include each other (cpu / cuda: two
// backends; weights / parallel). Public headers belong to the room that owns their
// concept (kPublicRoom below); a new public header must be given a room here.
// Frontends (src/cli, bench/, python/) include public headers (mlakv/...) only.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const std::map<std::string, int> kRank = {
    {"core", 0},  {"format", 1},    {"memory", 2},    {"cache", 3},  {"attention", 4}, {"cpu", 5},
    {"cuda", 5},  {"io", 6},        {"weights", 7},   {"parallel", 7}, {"tokenizer", 8}, {"model", 9},
    {"calib", 10}, {"eval", 11},
};

// The room of each public header (include/mlakv/<name>.h). model_config.h and
// mla_geometry.h are plain data (the model's shape) that every room may read; their
// readers (presets, config.json) live in src/model/.
const std::map<std::string, std::string> kPublicRoom = {
    {"status", "core"},          {"tensor", "core"},          {"file_io", "core"},       {"rng", "core"},
    {"untrusted", "core"},
    {"numerics", "format"},      {"formats", "format"},       {"codec", "format"},
    {"mla_geometry", "format"},  {"model_config", "format"},  {"allocator", "memory"},
    {"cache", "cache"},          {"attention", "attention"},  {"attn_state", "attention"},
    {"thread_pool", "cpu"},      {"roofline", "cpu"},         {"cuda", "cuda"},
    {"tensor_source", "io"},     {"safetensors", "io"},       {"kv_b_proj", "weights"},
    {"absorb", "weights"},       {"synthetic_weights", "weights"}, {"parallel", "parallel"},
    {"dcp", "parallel"},         {"tokenizer", "tokenizer"},  {"hf_config", "model"},
    {"mla_layer", "model"},      {"plan", "model"},           {"cuda_layer", "model"},
    {"model", "model"},          {"outer_scales", "calib"},   {"eval_stats", "eval"},
    {"synthetic", "eval"},       {"eval", "eval"},            {"reparam", "model"},
    {"latent_transform", "format"}, {"latent_calib", "calib"},
};

const std::vector<std::string> kFrontends = {"src/cli", "bench", "python"};

struct Include {
  std::string file, target;
};

std::vector<Include> includes_under(const fs::path& root, const fs::path& dir) {
  std::vector<Include> out;
  if (!fs::exists(root / dir)) return out;
  static const std::regex inc(R"re(^\s*#\s*include\s*"([^"]+)")re");
  for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh" && ext != ".cpp") continue;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, inc)) out.push_back({fs::relative(e.path(), root).string(), m[1]});
    }
  }
  return out;
}

std::string first_component(const std::string& p) { return p.substr(0, p.find('/')); }

// The room an include names: "mlakv/x.h" -> kPublicRoom[x]; "room/..." -> room.
// Empty when the public header has no room (reported by the caller).
std::string room_of_include(const std::string& target) {
  if (target.rfind("mlakv/", 0) == 0) {
    const std::string name = fs::path(target).stem().string();
    const auto it = kPublicRoom.find(name);
    return it == kPublicRoom.end() ? "" : it->second;
  }
  return first_component(target);
}

const fs::path kRoot = MLAKV_SOURCE_DIR;

TEST(Layout, EveryPublicHeaderHasARoom) {
  for (const auto& e : fs::directory_iterator(kRoot / "include/mlakv")) {
    const std::string name = e.path().stem().string();
    EXPECT_TRUE(kPublicRoom.count(name)) << "include/mlakv/" << e.path().filename().string()
                                         << " has no room in tests/layout_test.cc (kPublicRoom)";
  }
}

TEST(Layout, EverySourceFolderIsARoom) {
  for (const auto& e : fs::directory_iterator(kRoot / "src")) {
    if (!e.is_directory()) continue;
    const std::string room = e.path().filename().string();
    EXPECT_TRUE(kRank.count(room) || room == "cli")
        << "src/" << room << " is not a room of docs/design.md (tests/layout_test.cc kRank)";
  }
}

TEST(Layout, IncludesPointDown) {
  std::vector<std::string> bad;
  auto check = [&](const Include& inc, const std::string& from_room) {
    const std::string to = room_of_include(inc.target);
    if (to.empty()) return;  // unknown public header: EveryPublicHeaderHasARoom reports it
    if (to == from_room || !kRank.count(to)) return;  // same room, or a local header of a test/tool
    const int a = kRank.at(from_room), b = kRank.at(to);
    if (b > a) bad.push_back(inc.file + " (" + from_room + ") includes " + inc.target + " (" + to + ", a higher room)");
    if (b == a) bad.push_back(inc.file + " (" + from_room + ") includes " + inc.target + " (" + to + ", a sibling room)");
  };
  for (const auto& inc : includes_under(kRoot, "src")) {
    const std::string room = fs::path(inc.file).begin()->string() == "src"
                                 ? std::next(fs::path(inc.file).begin())->string()
                                 : "";
    if (room == "cli" || !kRank.count(room)) continue;  // frontends: next test
    check(inc, room);
  }
  for (const auto& inc : includes_under(kRoot, "include/mlakv")) {
    const auto it = kPublicRoom.find(fs::path(inc.file).stem().string());
    if (it != kPublicRoom.end()) check(inc, it->second);
  }
  std::ostringstream msg;
  for (const auto& b : bad) msg << "\n  " << b;
  EXPECT_TRUE(bad.empty()) << "the dependency rule (docs/design.md) is broken:" << msg.str();
}

TEST(Layout, FrontendsUseThePublicApiOnly) {
  std::vector<std::string> bad;
  for (const auto& dir : kFrontends) {
    for (const auto& inc : includes_under(kRoot, dir)) {
      const std::string c = first_component(inc.target);
      // Public headers, the frontend's own headers (cli/...), and headers next to the file.
      if (c == "mlakv" || inc.target.find('/') == std::string::npos || c == fs::path(dir).filename().string()) continue;
      bad.push_back(inc.file + " includes " + inc.target);
    }
  }
  std::ostringstream msg;
  for (const auto& b : bad) msg << "\n  " << b;
  EXPECT_TRUE(bad.empty()) << "frontends must include include/mlakv/ only:" << msg.str();
}

// The checker itself: a planted upward include is caught (guards against a rule that
// silently checks nothing, e.g. a wrong root).
TEST(Layout, CheckerSeesTheTree) {
  const auto src = includes_under(kRoot, "src");
  EXPECT_GT(src.size(), 100u);
  EXPECT_EQ(room_of_include("mlakv/mla_layer.h"), "model");
  EXPECT_EQ(room_of_include("format/record_codec.h"), "format");
  EXPECT_GT(kRank.at("model"), kRank.at("weights"));
}

}  // namespace
