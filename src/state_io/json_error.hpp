// src/state_io/json_error.hpp — an nlohmann parse exception as words for our messages:
// where parsing stopped and what nlohmann expected, without the input it quotes.
#ifndef SHARDADAM_SRC_STATE_IO_JSON_ERROR_HPP_
#define SHARDADAM_SRC_STATE_IO_JSON_ERROR_HPP_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace sa {

struct JsonError {
  bool has_position = false;
  uint64_t position =
      0;  // 0-based index of the byte where parsing stopped (the text's size: its end)
  std::string
      reason;  // e.g. "syntax error while parsing object separator - invalid literal; expected ':'"
};

// nlohmann quotes the input near the error ("; last read: '<token>'", "number overflow
// parsing '<token>'"): bytes of a file that may be binary, hostile or huge, which have no
// place in an error message. What is left is nlohmann's own text, and anything outside
// printable ASCII in it is replaced by '?' (a last guard should its wording change).
inline JsonError describe_json_error(const nlohmann::json::exception& e) {
  JsonError out;
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const std::size_t tag_end = text.find("] ");
    if (tag_end != std::string::npos) text.erase(0, tag_end + 2);
  }
  if (const auto* parse = dynamic_cast<const nlohmann::json::parse_error*>(&e)) {
    // "parse error at line 1, column 12: <reason>": our position replaces nlohmann's.
    if (parse->byte > 0) {
      out.has_position = true;
      out.position = parse->byte - 1;
    }
    const std::size_t colon = text.find(": ");
    if (text.rfind("parse error", 0) == 0 && colon != std::string::npos) text.erase(0, colon + 2);
    // "<reason>; last read: '<token>'[; expected <token kind>]". The kinds nlohmann names
    // ("'}'", "string literal", "end of input", ...) are words and punctuation only.
    const std::string last_read = "; last read: '";
    const std::size_t token = text.find(last_read);
    if (token != std::string::npos) {
      const std::string expected = "'; expected ";
      const std::size_t close = text.rfind(expected);
      std::string tail;
      if (close != std::string::npos && close + 1 >= token + last_read.size()) {
        tail = text.substr(close + 1);
        const bool words =
            tail.size() < 48 &&
            tail.find_first_not_of("; abcdefghijklmnopqrstuvwxyz'[]{}:,") == std::string::npos;
        if (!words) tail.clear();
      }
      text = text.substr(0, token) + tail;
    }
  } else if (e.id == 406) {  // out_of_range: "number overflow parsing '<token>'"
    text = "a number too large for a double";
  } else {
    text = text.substr(0, text.find('\''));
  }
  for (char& c : text)
    if (c < 0x20 || c > 0x7E) c = '?';
  out.reason = text;
  return out;
}

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_JSON_ERROR_HPP_
