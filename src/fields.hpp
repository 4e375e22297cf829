// src/fields.hpp — the option structs of the C ABI checked, described and defaulted from
// src/schema.hpp's tables of their fields: one check and one message format for every
// struct, and the tables the bindings read (sa_struct_field) to fill structs by name.
#ifndef SHARDADAM_SRC_FIELDS_HPP_
#define SHARDADAM_SRC_FIELDS_HPP_

#include <cstdint>
#include <string>

#include "shardadam/shardadam.h"

namespace sa {

// Checks every field of the struct of sa_struct_kind `kind` at `s` (a whole struct of this
// library's size, as read_options makes it; not SA_STRUCT_GROUP_CONFIG, whose checks are
// check_group_config's) against its table: a number within its bounds, a dtype unset or
// one of the library's with the field's role. Throws SA_ERR_INVALID_ARGUMENT (a dtype:
// SA_ERR_UNSUPPORTED) saying
// "<context>: <prefix><name> is <value>; it must be <rule> (<why>)" (no "<context>: " when
// it is empty).
void check_fields(int32_t kind, const void* s, const std::string& context, const char* prefix);

// The fields the library knows of struct `kind` (0 for an unknown kind), and field
// `index`'s description (SA_ERR_INVALID_ARGUMENT for an unknown kind or index).
int32_t num_fields(int32_t kind);
sa_field_info describe_field(int32_t kind, int32_t index);

// Writes the defaults of struct `kind` (its SA_*_INIT) into `out`, whose first field is its
// struct_size, as far as that reaches; SA_ERR_INVALID_ARGUMENT for an unknown kind.
void write_defaults(int32_t kind, void* out);

}  // namespace sa

#endif  // SHARDADAM_SRC_FIELDS_HPP_
