// src/errors.hpp — how the core reports failure: throw sa::Error(status, message). The C
// ABI layer (src/api.cpp) is the only place that catches and turns it into a status plus
// the handle's last-error text.
#ifndef SHARDADAM_SRC_ERRORS_HPP_
#define SHARDADAM_SRC_ERRORS_HPP_

#include <sstream>
#include <stdexcept>
#include <string>

#include "shardadam/shardadam.h"

namespace sa {

class Error : public std::runtime_error {
 public:
  Error(sa_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  sa_status status() const { return status_; }

 private:
  sa_status status_;
};

// Concatenates anything streamable: fail(SA_ERR_MISMATCH, "param '", name, "': ...").
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

template <class... Parts>
[[noreturn]] void fail(sa_status status, const Parts&... parts) {
  throw Error(status, concat(parts...));
}

// "a", "a or b", "a, b or c" (last_word " and " for "a, b and c"): a list in a message.
template <class Seq>
std::string words_list(const Seq& items, const char* last_word = " or ") {
  std::string out;
  std::size_t i = 0;
  for (const auto& item : items) {
    out += concat(i == 0 ? "" : i + 1 == items.size() ? last_word : ", ", item);
    ++i;
  }
  return out;
}

// Writes "[a, b, c]" for a shape or coordinate.
template <class Seq>
std::string format_dims(const Seq& dims) {
  std::ostringstream out;
  out << '[';
  bool first = true;
  for (auto d : dims) {
    out << (first ? "" : ", ") << d;
    first = false;
  }
  out << ']';
  return out.str();
}

}  // namespace sa

#endif  // SHARDADAM_SRC_ERRORS_HPP_
