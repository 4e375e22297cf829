// src/errors.hpp — how the core reports failure: throw sa::Error(status, message). The C
// ABI layer (src/api.cpp) is the only place that catches and turns it into a status plus
// the handle's last-error text.
#ifndef SHARDADAM_SRC_ERRORS_HPP_
#define SHARDADAM_SRC_ERRORS_HPP_

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

namespace detail {

// One part of concat(): text and integers are appended directly (a context string such as
// "param 'w'" is made for every param an optimizer takes, and an ostringstream costs its
// locale's facets each time); anything else is written as its operator<< writes it, in a
// stream of its own (so a manipulator such as std::hex would reach no other part).
template <class T>
void append_part(std::string& out, const T& part) {
  if constexpr (std::is_pointer_v<T> && std::is_convertible_v<const T&, std::string_view>) {
    out += part != nullptr ? std::string_view(part) : std::string_view("(null)");
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(part);
  } else if constexpr (std::is_same_v<T, char>) {
    out += part;
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                       !std::is_same_v<T, signed char> && !std::is_same_v<T, unsigned char>) {
    out += std::to_string(part);  // as operator<< writes it (char types print as characters)
  } else {
    std::ostringstream stream;
    stream << part;
    out += stream.str();
  }
}

}  // namespace detail

// Concatenates anything streamable: fail(SA_ERR_MISMATCH, "param '", name, "': ...").
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (detail::append_part(out, parts), ...);
  return out;
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
