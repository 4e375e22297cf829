// first_step_check — judges what the first-step program of a documentation page
// (docs/c.md, docs/rust.md: the same weight, grad and group in each) printed: its "w" and
// "exp_avg" lines against one AdamW step computed here in double precision from the
// pages' inputs (written out again below, so the reference owes nothing to the library or
// to the page's code), and the page's own "It prints:" block against the program's lines.
//
//   first_step_check <program output> <expected output from the page>
//
// Exits 0 when both agree, 1 saying what differs.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The pages' weight, grad and group: lr 0.1, the rest SA_GROUP_CONFIG_INIT's documented
// defaults (torch.optim.AdamW's).
const double kInit[6] = {1.0, -2.0, 3.0, 0.5, -0.25, 4.0};
const double kGrad[6] = {0.5, 0.25, -1.0, 2.0, -0.125, 0.0};
const double kLr = 0.1, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWeightDecay = 0.01;

struct Step {
  std::vector<double> w, exp_avg;
};

// The first step of AdamW as shardadam.h writes the update (t = 1).
Step reference_step() {
  Step s;
  const double bc1 = 1.0 - kBeta1, bc2 = 1.0 - kBeta2;
  for (int i = 0; i < 6; ++i) {
    const double g = kGrad[i];
    const double p = kInit[i] * (1.0 - kLr * kWeightDecay);
    const double m = (1.0 - kBeta1) * g;
    const double v = (1.0 - kBeta2) * g * g;
    s.w.push_back(p - (kLr / bc1) * m / (std::sqrt(v) / std::sqrt(bc2) + kEps));
    s.exp_avg.push_back(m);
  }
  return s;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "first_step_check: cannot open " << path << "\n";
    std::exit(1);
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The six numbers of the line "<name> = a b c d e f" (name padded with spaces), or fails.
std::vector<double> values_of(const std::vector<std::string>& lines, const std::string& name) {
  for (const std::string& line : lines) {
    std::istringstream in(line);
    std::string word, equals;
    if (!(in >> word >> equals) || word != name || equals != "=") continue;
    std::vector<double> values;
    for (double v; in >> v;) values.push_back(v);
    if (values.size() != 6) {
      std::cerr << "first_step_check: the line '" << line << "' holds " << values.size()
                << " numbers, not 6\n";
      std::exit(1);
    }
    return values;
  }
  std::cerr << "first_step_check: the program printed no line '" << name << " = ...'\n";
  std::exit(1);
}

// Printed with 6 decimals: half a unit of the last one, plus float32 rounding.
bool agree(const std::string& name, const std::vector<double>& got,
           const std::vector<double>& want) {
  bool ok = true;
  for (int i = 0; i < 6; ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    if (diff > 5e-7 + 1e-6 * std::fabs(want[i])) {
      std::fprintf(stderr, "first_step_check: %s[%d] = %.6f, the float64 reference is %.9f\n",
                   name.c_str(), i, got[i], want[i]);
      ok = false;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: first_step_check <program output> <expected output>\n";
    return 2;
  }
  const std::vector<std::string> printed = read_lines(argv[1]);
  const Step want = reference_step();
  bool ok = agree("w", values_of(printed, "w"), want.w);
  ok = agree("exp_avg", values_of(printed, "exp_avg"), want.exp_avg) && ok;

  const std::set<std::string> printed_set(printed.begin(), printed.end());
  int shown = 0;
  for (const std::string& line : read_lines(argv[2])) {
    if (line.empty()) continue;
    ++shown;
    if (printed_set.count(line) == 0) {
      std::cerr << "first_step_check: the page shows the line '" << line
                << "', which the program did not print\n";
      ok = false;
    }
  }
  if (shown == 0) {
    std::cerr << "first_step_check: the page's expected output is empty\n";
    ok = false;
  }
  if (ok)
    std::cout << "first_step_check: w and exp_avg match the float64 AdamW step and the page\n";
  return ok ? 0 : 1;
}
