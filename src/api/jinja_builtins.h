// Jinja's filters, tests and globals, and Python's methods of strings and dicts, as a chat
// template meets them under transformers (whose raise_exception, strftime_now and tojson are
// among the globals and filters). Each takes its arguments as Jinja passes them (positional,
// then by keyword) and answers InvalidArgument naming itself for arguments it cannot take.
#pragma once

#include <string_view>

#include "api/jinja_value.h"
#include "core/status.h"

namespace colony::api::jinja {

// Bounds on what one rendering may build: strings and lists longer than these are errors, as
// are more than this many steps (RenderLimits in jinja_template.h sets them).
struct Budget {
  size_t max_string_bytes = 0;
  size_t max_list_items = 0;
};

bool IsFilter(std::string_view name);
bool IsTest(std::string_view name);

Result<Value> ApplyFilter(std::string_view name, const Value& operand, Args& args,
                          const Budget& budget);
Result<bool> ApplyTest(std::string_view name, const Value& operand, Args& args);
// `obj.name` as Jinja looks it up: a method of a string or a dict (a function bound to `obj`),
// otherwise the dict's member; undefined when there is neither.
Value Attribute(const Value& obj, std::string_view name, const Budget& budget);
// `obj[key]`: a dict's member, a list's or a string's item (negative counts from the end),
// undefined when there is none.
Value Item(const Value& obj, const Value& key);
// `obj[start:stop:step]` of a list or a string (absent parts undefined).
Result<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// range, namespace, dict, raise_exception, strftime_now; undefined for other names.
Value Global(std::string_view name);

// Python's str() of a value, bounded.
Result<Value> Concat(const Value& a, const Value& b, const Budget& budget);
// + - * / // % ** between numbers, strings and lists as Python computes them.
Result<Value> Arithmetic(std::string_view op, const Value& a, const Value& b, const Budget& budget);
// Python's printf-style `format % args`: %s %r %d %i %x %X %o %c %f %F %e %E %g %G %% with
// flags, width and precision, and %(key)s of a dict.
Result<Value> PercentFormat(const std::string& format, const Value& args, const Budget& budget);
// `a in b`.
Result<bool> Contains(const Value& container, const Value& item);
// The items a for loop (or list(), join, map...) goes through: a list's items, a dict's keys, a
// string's characters; none for undefined; InvalidArgument for what cannot be iterated.
Result<List> Iterate(const Value& v);

}  // namespace colony::api::jinja
