// doc_blocks — takes the fenced code blocks out of a documentation page, so that a test
// can build and run them as the page shows them.
//
//   doc_blocks <page.md> <out dir>
//
// Every fenced block of the page must follow a marker line of its own, an HTML comment
// that the rendered page does not show:
//
//   <!-- file: NAME -->       the block is (the next part of) the file NAME, a relative
//                             path ("src/main.rs"): the blocks marked with one name are
//                             joined in page order
//   <!-- run: NAME -->        the block is a shell script, written to NAME.sh
//   <!-- output: NAME -->     the block is what the program NAME prints, written to NAME.out
//   <!-- untested: WHY -->    the block is not taken out (WHY says why; it must say)
//
// A block without a marker is an error: a page tested as written has no code that no
// test reads. Exits 1 naming the page's line for any such error, 2 for a usage error.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

struct Marker {
  std::string kind;  // file, run, output, untested
  std::string name;  // the file, script or program; for untested, the reason
  int line = 0;      // of the marker, 1-based
};

int fail(const std::string& page, int line, const std::string& why) {
  std::cerr << page << ":" << line << ": " << why << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: doc_blocks <page.md> <out dir>\n";
    return 2;
  }
  const std::string page = argv[1];
  const std::string out_dir = argv[2];
  std::ifstream in(page);
  if (!in) {
    std::cerr << "doc_blocks: cannot open " << page << "\n";
    return 2;
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);

  const std::regex marker_re(R"(^<!-- (file|run|output|untested): (.*\S) -->$)");
  // Relative paths that stay in the out dir: no "..", no leading "/" or ".".
  const std::regex name_re(R"(^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$)");
  std::map<std::string, std::string> files;  // output file name -> content
  std::set<std::string> single;              // run and output names: one block each
  int blocks = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int line_no = static_cast<int>(i) + 1;
    std::smatch m;
    if (std::regex_match(lines[i], m, marker_re)) {
      const Marker marker{m[1], m[2], line_no};
      if (i + 1 >= lines.size() || lines[i + 1].rfind("```", 0) != 0)
        return fail(page, line_no, "a marker not followed at once by a fenced block");
      size_t end = i + 2;
      while (end < lines.size() && lines[end].rfind("```", 0) != 0) ++end;
      if (end == lines.size()) return fail(page, line_no + 1, "a fenced block that never ends");
      std::string body;
      for (size_t k = i + 2; k < end; ++k) body += lines[k] + "\n";
      if (marker.kind != "untested") {
        if (!std::regex_match(marker.name, name_re))
          return fail(page, line_no, "'" + marker.name + "' is not a relative file name");
        std::string target = marker.name;
        if (marker.kind == "run") target += ".sh";
        if (marker.kind == "output") target += ".out";
        if (marker.kind != "file" && !single.insert(target).second)
          return fail(page, line_no, "a second block for " + target);
        files[target] += body;
        ++blocks;
      }
      i = end;  // past the closing fence
    } else if (lines[i].rfind("```", 0) == 0) {
      return fail(page, line_no,
                  "a fenced block without a marker (<!-- file: NAME -->, <!-- run: NAME -->, "
                  "<!-- output: NAME --> or <!-- untested: WHY -->) on the line before it");
    }
  }
  if (blocks == 0) return fail(page, 1, "no marked block to take out");
  for (const auto& [name, content] : files) {
    const std::filesystem::path path = std::filesystem::path(out_dir) / name;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::binary);
    out << content;
    if (!out) {
      std::cerr << "doc_blocks: cannot write " << path.string() << "\n";
      return 1;
    }
    std::cout << "doc_blocks: " << path.string() << "\n";
  }
  return 0;
}
