#pragma once
// Arrow values as JSON, the way `datasets` hands a row to Python: a struct is an object with its fields in the
// schema's order, a list an array, a null null (a struct field one row lacks is null in it, as in Python), strings,
// integers, floats and booleans themselves. Read straight from the arrays (nested `messages` too), never through
// JSON text. Types a dataset row of text holds no need for (timestamps, binary, maps, unions, decimals) are refused
// by `unreadable_type` on the schema, before any row is read.
#include <cstdint>
#include <string>

#include <arrow/api.h>
#include <nlohmann/json.hpp>

namespace hpctrain::datasets {

/// Empty when json_of converts values of `type`; else the type (or the nested type) it does not.
inline std::string unreadable_type(const arrow::DataType& type) {
  switch (type.id()) {
    case arrow::Type::NA:
    case arrow::Type::BOOL:
    case arrow::Type::INT8:
    case arrow::Type::INT16:
    case arrow::Type::INT32:
    case arrow::Type::INT64:
    case arrow::Type::UINT8:
    case arrow::Type::UINT16:
    case arrow::Type::UINT32:
    case arrow::Type::UINT64:
    case arrow::Type::FLOAT:
    case arrow::Type::DOUBLE:
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW: return "";
    case arrow::Type::LIST:
    case arrow::Type::LARGE_LIST:
    case arrow::Type::FIXED_SIZE_LIST: return unreadable_type(*type.field(0)->type());
    case arrow::Type::STRUCT:
      for (const auto& field : type.fields())
        if (auto inner = unreadable_type(*field->type()); !inner.empty()) return inner;
      return "";
    default: return type.ToString();
  }
}

inline nlohmann::ordered_json json_of(const arrow::Array& array, std::int64_t i);

namespace detail {
template <class Array>
nlohmann::ordered_json number_of(const arrow::Array& array, std::int64_t i) {
  return static_cast<const Array&>(array).Value(i);
}

template <class List>
nlohmann::ordered_json list_of(const arrow::Array& array, std::int64_t i) {
  const auto& list = static_cast<const List&>(array);
  const auto& values = *list.values();
  auto items = nlohmann::ordered_json::array();
  const auto begin = static_cast<std::int64_t>(list.value_offset(i));
  const auto end = begin + static_cast<std::int64_t>(list.value_length(i));
  for (auto k = begin; k < end; ++k) items.push_back(json_of(values, k));
  return items;
}

template <class Strings>
nlohmann::ordered_json string_of(const arrow::Array& array, std::int64_t i) {
  return std::string(static_cast<const Strings&>(array).GetView(i));
}
}  // namespace detail

/// The value at `i` of `array`, whose type unreadable_type accepts.
inline nlohmann::ordered_json json_of(const arrow::Array& array, std::int64_t i) {
  if (array.IsNull(i)) return nullptr;
  switch (array.type_id()) {
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(array).Value(i);
    case arrow::Type::INT8: return detail::number_of<arrow::Int8Array>(array, i);
    case arrow::Type::INT16: return detail::number_of<arrow::Int16Array>(array, i);
    case arrow::Type::INT32: return detail::number_of<arrow::Int32Array>(array, i);
    case arrow::Type::INT64: return detail::number_of<arrow::Int64Array>(array, i);
    case arrow::Type::UINT8: return detail::number_of<arrow::UInt8Array>(array, i);
    case arrow::Type::UINT16: return detail::number_of<arrow::UInt16Array>(array, i);
    case arrow::Type::UINT32: return detail::number_of<arrow::UInt32Array>(array, i);
    case arrow::Type::UINT64: return detail::number_of<arrow::UInt64Array>(array, i);
    case arrow::Type::FLOAT:  // as Python widens it: 0.1f is 0.10000000149011612
      return static_cast<double>(static_cast<const arrow::FloatArray&>(array).Value(i));
    case arrow::Type::DOUBLE: return detail::number_of<arrow::DoubleArray>(array, i);
    case arrow::Type::STRING: return detail::string_of<arrow::StringArray>(array, i);
    case arrow::Type::LARGE_STRING: return detail::string_of<arrow::LargeStringArray>(array, i);
    case arrow::Type::STRING_VIEW: return detail::string_of<arrow::StringViewArray>(array, i);
    case arrow::Type::LIST: return detail::list_of<arrow::ListArray>(array, i);
    case arrow::Type::LARGE_LIST: return detail::list_of<arrow::LargeListArray>(array, i);
    case arrow::Type::FIXED_SIZE_LIST: return detail::list_of<arrow::FixedSizeListArray>(array, i);
    case arrow::Type::STRUCT: {
      const auto& fields = static_cast<const arrow::StructArray&>(array);
      auto object = nlohmann::ordered_json::object();
      for (int f = 0; f < fields.num_fields(); ++f)
        object[fields.struct_type()->field(f)->name()] = json_of(*fields.field(f), i);
      return object;
    }
    default: return nullptr;  // NA; the others are refused on the schema (unreadable_type)
  }
}

}  // namespace hpctrain::datasets
