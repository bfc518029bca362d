// response_format {"type": "json_schema"} (OpenAI's structured outputs): a JSON Schema compiled
// for generation (JsonSchema), and the texts that can still become a JSON object valid against it,
// read a byte at a time (JsonSchemaPrefix, over JsonObjectPrefix's syntax). What a schema may say
// is a subset, each keyword checked and any other refused by name (never ignored):
//   type (a name or a list), enum, const (both: the enum's values equal to it), anyOf and oneOf
//   (whose branches differ in the first byte of their values: an object and null, a string and a
//   number; "Optional" fields; in an anyOf, integers and numbers make their union where it is
//   unbounded numbers or one range of integers; objects, a discriminated union: models that each
//   have one property, discriminator's propertyName or the first that will do, whose string
//   values no other has, written first), $ref to #/$defs/... or
//   #/definitions/... (each target compiled once, its node shared; recursive but through the
//   target's own $ref or allOf, or an anyOf among its own branches: pydantic's trees, linked
//   lists and recursive unions, written at most kMaxFrames objects and arrays deep, see
//   JsonSchemaPrefix), properties,
//   required, additionalProperties, items, prefixItems (a tuple: each place's schema, then items'
//   for the rest; items false: no more), items as a list with additionalItems (the same, as
//   drafts before 2020-12 wrote tuples), minItems, maxItems, uniqueItems (of an enum's or const's
//   values, at most 64: a bit each in the state), minLength, maxLength (a string's
//   characters: Unicode code points, an escape or a surrogate pair's two escapes one), minimum,
//   maximum, exclusiveMinimum, exclusiveMaximum (within +-10^15; of a number that may have a
//   fraction, compared exactly as decimals: see JsonSchema::Side), and the annotations (title,
//   description, default, examples, ...).
// An answer writes only the properties the schema names (each at most once, in any order, the
// required ones all), so additionalProperties changes nothing but for an object without
// properties: true or absent, any object; false, only {}; a schema, a map (pydantic's
// dict[str, X]: any keys, each value valid against it; a key may repeat, as JSON allows, each of
// its values valid). format is an
// annotation (2020-12's default), and so is $id at the root (refused below it, where it would move
// the base of the $refs under it); allOf of one schema is that schema. A property name or
// an enum value is written as nlohmann::json writes it, compactly; an integer has no fraction or
// exponent. The root must be able to be an object. Torch-free.
//
//   auto schema = JsonSchema::Compile(json::parse(R"({"type": "object", "properties": {...}})"));
//   JsonSchemaPrefix p(schema->get());
//   p.Feed("{\"name\": \"Ada\"");  // true: it can still become a valid object
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "api/json_prefix.h"
#include "core/status.h"

namespace colony::api {

class JsonSchema {
 public:
  static constexpr size_t kMaxNodes = 1024;  // a $ref's target counted once
  static constexpr int kMaxDepth = 16;       // objects and arrays the schema nests
  // Objects and arrays of the schema's own an answer nests (a reader's frames): a recursive
  // schema's values nest no deeper.
  static constexpr int kMaxFrames = kMaxDepth + 1;
  static constexpr uint8_t kTooTall = 255;        // a value that would nest deeper (Node::frames)
  static constexpr size_t kMaxProperties = 64;    // of one object
  static constexpr size_t kMaxEnumValues = 1024;  // of one enum
  static constexpr size_t kMaxTextBytes = 1024;   // a property name's or enum value's JSON text
  static constexpr int kMaxValueNesting = 32;     // an enum value's arrays and objects
  static constexpr size_t kMaxBranches = 16;      // of one anyOf
  static constexpr int kMaxNested = 64;  // schemas within schemas (properties, anyOf, $ref...)
  static constexpr size_t kMaxCompiled = 16 * kMaxNodes;  // schemas compiled in all
  static constexpr uint32_t kMaxMinItems = 256;
  static constexpr size_t kMaxPrefixItems = 256;  // places of a tuple (prefixItems)
  static constexpr size_t kMaxUniqueValues = 64;  // of uniqueItems' enum (a bit each in a state)
  // Of the discriminated unions' values, in all (each union keeps them, but once for any number
  // of anyOfs of the same models).
  static constexpr size_t kMaxUnionTextBytes = 256 * 1024;
  static constexpr uint32_t kMaxMinLength = 16 * 1024;         // characters a string must have
  static constexpr int64_t kMaxBound = 1'000'000'000'000'000;  // of a minimum, maximum
  static constexpr int64_t kNoMinimum = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kNoMaximum = std::numeric_limits<int64_t>::max();
  static constexpr size_t kMaxSmallestAnswer = 64 * 1024;  // bytes of the shortest valid answer

  // What a value's first byte says it is.
  enum Slot : uint8_t { kObject, kArray, kString, kNumber, kBoolean, kNull, kSlots };
  static constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

  // A bounded number's bound without its sign, as an exact decimal: whole + 0.fraction.
  struct Magnitude {
    int64_t whole = 0;
    std::string fraction;  // the digits after the point, without trailing zeros
  };
  // The magnitudes [low, high] of a bounded number's values of one sign (high: none unless
  // capped). A bound is the shortest decimal text of its double, an exclusive one of the double
  // next to it inside: rounding to the nearest double never decreases, so a decimal within the
  // texts parses to a double within the bounds, whatever its digits.
  struct Side {
    bool allowed = false;  // any value of this sign (0 counts as both)
    Magnitude low;
    bool capped = false;
    Magnitude high;
  };

  struct Node {
    std::array<int16_t, kSlots> by_slot;  // the node a value of each kind follows; -1: refused
    bool any = false;                     // any JSON value of its kinds
    bool integer = false;                 // a number without fraction or exponent
    std::vector<std::string> values;      // enum: its values' JSON texts, sorted
    // An enum that is a unique array's items: bit j of alike[i], value j equals value i by JSON
    // Schema's equality (numbers by their values: 1 and 1.0 alike; i's own bit set).
    std::vector<uint64_t> alike;
    // An object's properties: names as JSON writes them between the quotes, sorted, and nodes.
    std::vector<std::string> names;
    std::vector<int16_t> properties;
    uint64_t required = 0;  // bit i: names[i]
    // An object without properties whose additionalProperties is a schema (a map): its values'
    // node; -1: none.
    int16_t additional = -1;
    // A discriminated union of objects (an anyOf's or oneOf's): names[0] is the property that
    // tells them apart (written first), properties[0] an enum node of its values, and for each
    // value (in the enum's order) its branch's object node and the property's index there. The
    // object goes on as that node once the value is read.
    std::vector<std::pair<int16_t, uint8_t>> branches;
    // An array's items: the first ones' (prefixItems, a tuple's places), then the others'
    // (node 0: any value; where there may be no others, max_items says so).
    std::vector<int16_t> prefix;
    int16_t items = 0;
    uint32_t min_items = 0, max_items = kUnbounded;
    bool unique = false;  // uniqueItems: items is an enum node (alike set), no prefix
    int16_t item(uint32_t i) const { return i < prefix.size() ? prefix[i] : items; }
    uint32_t min_length = 0, max_length = kUnbounded;  // a string's characters
    // An integer's least and greatest values (exclusive bounds made inclusive); kNo...: none.
    int64_t minimum = kNoMinimum, maximum = kNoMaximum;
    bool bounded() const { return minimum != kNoMinimum || maximum != kNoMaximum; }
    // A number that may have a fraction, bounded: its values' magnitudes by sign (0: positive
    // ones, and 0; 1: negative ones, and -0).
    bool decimal = false;
    std::array<Side, 2> sides;
    // Frames a value of each kind takes at the least (a frame for each object and array of the
    // schema's own, itself included; kTooTall: more than kMaxFrames), the least of its kinds',
    // and an object's: the most any of its properties' (a map's values') least takes.
    std::array<uint8_t, kSlots> frames{};
    uint8_t least = 0;
    uint8_t tallest = 0;
    // The kind whose value Smallest writes within each number of frames (kSlots: none fits),
    // and a union's value (its branch fitting, its object the shortest).
    std::array<uint8_t, kMaxFrames + 1> shortest{};
    std::array<uint16_t, kMaxFrames + 1> value{};
  };

  // InvalidArgument naming what is not supported or wrong, and where (a JSON pointer).
  static Result<std::shared_ptr<const JsonSchema>> Compile(const nlohmann::json& schema);

  const Node& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
  // This compilation's own number, never another's in the process (masks of its states are kept
  // by it: api/json_masks.h).
  uint64_t id() const { return id_; }
  size_t bytes() const { return bytes_; }  // about what its nodes take in memory
  int root() const { return root_; }
  // The shortest text of a value of node `i` within `frames` frames (the shortest of its kinds'
  // that fit, each written at its shortest; ties: the first kind in Slot's order).
  std::string Smallest(int i, int frames = kMaxFrames) const;
  // The shortest integer within n's bounds (0 if they allow it); of a bounded number, a short
  // number within its bounds (the integer nearest 0 within them, if any).
  static std::string SmallestNumber(const Node& n);
  // The first value of enum node `e` that no value in `used` (bits of e's values) is alike to;
  // adds it and its alike ones to `used`. Some value must be left.
  std::string UnusedValue(int e, uint64_t& used) const;

  struct Compiler;

 private:
  std::vector<Node> nodes_;  // 0: any value
  int root_ = 0;
  uint64_t id_ = 0;
  size_t bytes_ = 0;
};

class JsonSchemaPrefix {
 public:
  static constexpr int kMaxFrames = JsonSchema::kMaxFrames;

  // Without a schema: any JSON object (JsonObjectPrefix's rules alone). The schema must outlive it.
  explicit JsonSchemaPrefix(const JsonSchema* schema = nullptr) : schema_(schema) {}
  // Copies only the frames in use: a mask copies the state once per token of the vocabulary.
  JsonSchemaPrefix(const JsonSchemaPrefix& other);
  JsonSchemaPrefix& operator=(const JsonSchemaPrefix& other);
  ~JsonSchemaPrefix() = default;

  // Whether the text read so far followed by `bytes` can still become a valid object. A false is
  // final (copy the state first to try a text).
  bool Feed(std::string_view bytes) {
    if (schema_ != nullptr) return FeedSchema(bytes);
    if (!bad_ && !syntax_.Feed(bytes)) bad_ = true;  // (the syntax's own loop: masks feed every
    return !bad_;                                    // token's text)
  }
  bool Feed(char byte);

  bool complete() const { return !bad_ && syntax_.complete() && (schema_ == nullptr || done_); }
  // Inside a string where any text without '"', '\\', control characters or an incomplete UTF-8
  // character can follow, up to string_room() characters (not a property name nor an enum value;
  // a map's key).
  bool between_string_characters() const {
    return syntax_.between_string_characters() &&
           (schema_ == nullptr || scalar_ == Scalar::kString || scalar_ == Scalar::kMapKey ||
            (scalar_ == Scalar::kAny && any_string_));
  }
  // How many more characters the string being read may take (maxLength); kUnbounded: any.
  uint32_t string_room() const {
    return scalar_ == Scalar::kString ? room_ : JsonSchema::kUnbounded;
  }
  const JsonObjectPrefix& syntax() const { return syntax_; }

  // The state as bytes: prefixes with equal keys (of one schema) take and refuse the same texts.
  // With `longest`, only the same texts of at most `longest` bytes (a mask's tokens): a string's
  // counts of characters needed and left past `longest` are alike then (so a long bounded string
  // is not a state, and a mask read, at every character), and so are a bounded array's counts of
  // items left.
  std::string key(uint32_t longest = JsonSchema::kUnbounded) const;
  // A short text that makes what was read a whole valid object (empty when it is one). Tests
  // check the prefixes with it.
  std::string Closing() const;

 private:
  enum class Scalar : uint8_t { kNone, kKey, kString, kNumber, kLiteral, kEnum, kAny, kMapKey };
  enum class Stage : uint8_t { kOpen, kKey, kColon, kValue, kAfter };
  struct Frame {     // (trivial: frames past depth_ are left unset)
    uint64_t used;   // an object's properties written; a unique array's values (alike bits)
    uint32_t count;  // an array's items
    int16_t node;
    int16_t value;  // an object's: the node of the value after the key just read
    bool array;
    Stage stage;
  };

  bool FeedSchema(std::string_view bytes);
  // `starts`: whether the byte begins a string's character or ends the string (the syntax was
  // between characters before it).
  bool Take(unsigned char c, bool starts);
  bool Structural(unsigned char c);
  bool StartValue(int node, unsigned char c);
  bool Key(unsigned char c);
  // Narrows values_ by the next byte; false if none has it (in a unique array: none not written).
  bool Enum(unsigned char c);
  bool EnumEnded();  // the enum's value values[lo_] read: false if a unique array has it already
  const Frame* UniqueArray() const;  // the top frame, if a unique array (items read as an enum)
  uint64_t Written() const;          // a unique array's values written (their alike bits); or 0
  // A bounded integer's byte ('-' or a digit): false if no integer it can still become is in
  // its bounds.
  bool IntegerByte(unsigned char c);
  // A bounded number's byte (not the end: DecimalEnds): false if no number it can still become
  // is within its bounds. Exponents are refused.
  bool DecimalByte(unsigned char c);
  bool DecimalEnds() const;  // whether the bounded number read is within its bounds
  bool AnyByte(unsigned char c);
  bool ValueEnded();
  std::string IntegerClosing() const;  // the rest of a bounded integer that makes it valid
  std::string DecimalClosing() const;  // and of a bounded number
  // Appends a closing of `f`, the frame at `depth` (from 0), to `out` (its value in progress
  // ended), as Closing() does.
  void CloseFrame(Frame f, int depth, std::string& out) const;
  // Where f's node is a union: f goes on as the object of value `value`'s branch, its property
  // written.
  void Chosen(Frame& f, uint16_t value) const;
  // The top frame's node if it is a union (before its property's value was read); and whether
  // value `value`'s branch fits in the frames left (the union's own included).
  const JsonSchema::Node* Union() const;
  bool BranchFits(const JsonSchema::Node& u, uint16_t value) const;
  // Whether a value of `node` fits in the frames left (a recursive schema's may not).
  bool Fits(int node) const { return depth_ + schema_->node(node).least <= JsonSchema::kMaxFrames; }
  // Frame f's properties not written yet whose values fit in `left` frames (the top frame's:
  // kMaxFrames - depth_).
  uint64_t Open(const Frame& f, const JsonSchema::Node& n, int left) const;

  const JsonSchema* schema_;
  JsonObjectPrefix syntax_;
  bool bad_ = false;
  bool done_ = false;  // the root object was read
  Scalar scalar_ = Scalar::kNone;
  bool escape_ = false;   // a key's or free string's byte after '\'
  bool integer_ = false;  // kNumber
  // kNumber of a bounded integer (node_): its sign, whether a digit was read, and the digits'
  // value (saturating past any bound).
  bool negative_ = false, digit_ = false;
  int64_t magnitude_ = 0;
  // kNumber of a bounded number (node_.decimal), after its point (point_: digit_ then says
  // whether a fraction digit was read): whether the fraction read equals that of the least and
  // greatest magnitude so far (their whole parts being the one read), and how many digits of
  // them it has matched (place_, at most their longer fraction's).
  bool point_ = false, tight_low_ = false, tight_high_ = false;
  uint16_t place_ = 0;
  // kString: the characters it must still take (minLength) and may still take (maxLength).
  uint32_t need_ = 0, room_ = JsonSchema::kUnbounded;
  // kKey, kEnum: the names or values [lo_, hi_) of node_ begin with the pos_ bytes read.
  uint16_t pos_ = 0, lo_ = 0, hi_ = 0;
  int16_t node_ = 0;
  // kAny: containers open in the value, whether in a string, whether a number or literal, and
  // the syntax's depth at its start.
  uint8_t any_depth_ = 0;
  bool any_string_ = false;
  bool any_scalar_ = false;
  uint8_t any_base_ = 0;
  int depth_ = 0;
  std::array<Frame, kMaxFrames> frames_;  // [0, depth_) in use (operator= copies those)
};

inline JsonSchemaPrefix::JsonSchemaPrefix(const JsonSchemaPrefix& other)
    : schema_(other.schema_),
      syntax_(other.syntax_),
      bad_(other.bad_),
      done_(other.done_),
      scalar_(other.scalar_),
      escape_(other.escape_),
      integer_(other.integer_),
      negative_(other.negative_),
      digit_(other.digit_),
      magnitude_(other.magnitude_),
      point_(other.point_),
      tight_low_(other.tight_low_),
      tight_high_(other.tight_high_),
      place_(other.place_),
      need_(other.need_),
      room_(other.room_),
      pos_(other.pos_),
      lo_(other.lo_),
      hi_(other.hi_),
      node_(other.node_),
      any_depth_(other.any_depth_),
      any_string_(other.any_string_),
      any_scalar_(other.any_scalar_),
      any_base_(other.any_base_),
      depth_(other.depth_) {
  std::copy_n(other.frames_.begin(), depth_, frames_.begin());
}

}  // namespace colony::api
