package main

// Strict JSON, as the Rust SDK reads a call's arguments (impl/src/wire/strict.rs
// `parse_strict`, on serde_json): duplicate keys, `null`, NaN/Infinity, numbers out of
// range and lone surrogates are refused, nesting is bounded. A syntax error anywhere is
// reported first (serde_json's first pass); the other faults in document order.
//
// encoding/json is not used: it keeps the last of duplicate keys, replaces lone
// surrogates silently and reads every number as a float64, so none of those faults would
// be seen, and an integer past 2^53 would lose its value.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// jsonMaxDepth is serde_json's nesting bound: a container at this depth is refused
// ("recursion limit exceeded").
const jsonMaxDepth = 128

type jsonKind int

const (
	jsonString jsonKind = iota
	jsonBool
	jsonNull
	// An integer serde_json reads as an i64 (negative) or u64 (non-negative).
	jsonInt
	jsonUint
	// Any other number: a fraction, an exponent, `-0`, or an integer past i64/u64.
	jsonFloat
	jsonArray
	jsonObject
)

// jsonValue is one parsed JSON value; an object keeps its members in document order.
type jsonValue struct {
	kind    jsonKind
	str     string
	boolean bool
	i       int64
	u       uint64
	f       float64
	items   []*jsonValue
	keys    []string
	vals    []*jsonValue
}

// member is the value of `key` in an object, or nil.
func (v *jsonValue) member(key string) *jsonValue {
	if v == nil || v.kind != jsonObject {
		return nil
	}
	for i, k := range v.keys {
		if k == key {
			return v.vals[i]
		}
	}
	return nil
}

// asFloat is the value as serde_json's `as_f64` reads a number.
func (v *jsonValue) asFloat() (float64, bool) {
	if v == nil {
		return 0, false
	}
	switch v.kind {
	case jsonInt:
		return float64(v.i), true
	case jsonUint:
		return float64(v.u), true
	case jsonFloat:
		return v.f, true
	}
	return 0, false
}

// asUint is the value as serde_json's `as_u64` reads it.
func (v *jsonValue) asUint() (uint64, bool) {
	if v == nil {
		return 0, false
	}
	switch v.kind {
	case jsonUint:
		return v.u, true
	case jsonInt:
		if v.i >= 0 {
			return uint64(v.i), true
		}
	}
	return 0, false
}

type syntaxError struct{ msg string }

func (e *syntaxError) Error() string { return e.msg }

type jsonParser struct {
	text string
	pos  int
	// Where the parser is, as segments: the path text is built only for a fault, so a
	// long key or a long array costs no copy per item.
	segs []pathSeg
	// The first non-syntax fault, in document order (reported only without a syntax
	// error anywhere).
	fault string
}

// parseStrict parses one JSON document strictly; the error is the text after
// `invalid_arguments: `.
func parseStrict(text string) (*jsonValue, error) {
	p := &jsonParser{text: text}
	v, err := p.document()
	if err != nil {
		return nil, fmt.Errorf("malformed JSON: %s", err.Error())
	}
	if p.fault != "" {
		return nil, fmt.Errorf("%s", p.fault)
	}
	return v, nil
}

// pathSeg is one step of a value's path: an object member or an array index.
type pathSeg struct {
	key   string
	index int
	isKey bool
}

// path is the current value's path, `$`, `$.key`, `$[3]`.
func (p *jsonParser) path() string {
	var b strings.Builder
	b.WriteString("$")
	for _, seg := range p.segs {
		if seg.isKey {
			b.WriteString(".")
			b.WriteString(seg.key)
		} else {
			fmt.Fprintf(&b, "[%d]", seg.index)
		}
	}
	return b.String()
}

func (p *jsonParser) note(fault string) {
	if p.fault == "" {
		p.fault = fault
	}
}

// position is serde_json's "at line L column C" of the current byte.
func (p *jsonParser) position() string {
	line, column := 1, 0
	for i := 0; i < p.pos && i < len(p.text); i++ {
		if p.text[i] == '\n' {
			line, column = line+1, 0
		} else {
			column++
		}
	}
	return fmt.Sprintf("line %d column %d", line, column)
}

func (p *jsonParser) fail(what string) error {
	return &syntaxError{fmt.Sprintf("%s at %s", what, p.position())}
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.text) {
		switch p.text[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) document() (*jsonValue, error) {
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos < len(p.text) {
		return nil, p.fail("trailing characters")
	}
	return v, nil
}

func (p *jsonParser) value(depth int) (*jsonValue, error) {
	if p.pos >= len(p.text) {
		return nil, p.fail("EOF while parsing a value")
	}
	switch c := p.text[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return &jsonValue{kind: jsonString, str: s}, nil
	case c == 't':
		return p.literal("true", &jsonValue{kind: jsonBool, boolean: true})
	case c == 'f':
		return p.literal("false", &jsonValue{kind: jsonBool})
	case c == 'n':
		v, err := p.literal("null", &jsonValue{kind: jsonNull})
		if err == nil {
			if p.fault == "" {
				p.note("null value at " + p.path())
			}
		}
		return v, err
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return nil, p.fail("expected value")
	}
}

func (p *jsonParser) literal(word string, v *jsonValue) (*jsonValue, error) {
	for i := 0; i < len(word); i++ {
		if p.pos >= len(p.text) {
			return nil, p.fail("EOF while parsing a value")
		}
		if p.text[p.pos] != word[i] {
			return nil, p.fail("expected ident")
		}
		p.pos++
	}
	return v, nil
}

func (p *jsonParser) object(depth int) (*jsonValue, error) {
	v := &jsonValue{kind: jsonObject}
	if empty, err := p.open('}', depth); err != nil || empty {
		return emptyOr(v, err)
	}
	seen := map[string]bool{}
	for {
		p.skipSpace()
		if p.pos >= len(p.text) {
			return nil, p.fail("EOF while parsing an object")
		}
		if p.text[p.pos] != '"' {
			return nil, p.fail("key must be a string")
		}
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		if seen[key] {
			if p.fault == "" {
				p.note(fmt.Sprintf("duplicate key `%s` at %s", key, p.path()))
			}
		}
		seen[key] = true
		p.skipSpace()
		if p.pos >= len(p.text) {
			return nil, p.fail("EOF while parsing an object")
		}
		if p.text[p.pos] != ':' {
			return nil, p.fail("expected `:`")
		}
		p.pos++
		p.skipSpace()
		p.segs = append(p.segs, pathSeg{key: key, isKey: true})
		item, err := p.value(depth)
		p.segs = p.segs[:len(p.segs)-1]
		if err != nil {
			return nil, err
		}
		v.keys = append(v.keys, key)
		v.vals = append(v.vals, item)
		done, err := p.afterItem('}', "an object")
		if err != nil {
			return nil, err
		}
		if done {
			return v, nil
		}
	}
}

func (p *jsonParser) array(depth int) (*jsonValue, error) {
	v := &jsonValue{kind: jsonArray}
	if empty, err := p.open(']', depth); err != nil || empty {
		return emptyOr(v, err)
	}
	for {
		p.skipSpace()
		p.segs = append(p.segs, pathSeg{index: len(v.items)})
		item, err := p.value(depth)
		p.segs = p.segs[:len(p.segs)-1]
		if err != nil {
			return nil, err
		}
		v.items = append(v.items, item)
		done, err := p.afterItem(']', "a list")
		if err != nil {
			return nil, err
		}
		if done {
			return v, nil
		}
	}
}

// open reads the opening byte of an object or a list (nesting bounded) and, when the
// closing byte follows at once, that too (empty).
func (p *jsonParser) open(closing byte, depth int) (bool, error) {
	if depth >= jsonMaxDepth {
		return false, p.fail("recursion limit exceeded")
	}
	p.pos++ // '{' or '['
	p.skipSpace()
	if p.pos < len(p.text) && p.text[p.pos] == closing {
		p.pos++
		return true, nil
	}
	return false, nil
}

// emptyOr is an empty object or list, or the error that stopped its opening.
func emptyOr(v *jsonValue, err error) (*jsonValue, error) {
	if err != nil {
		return nil, err
	}
	return v, nil
}

// afterItem reads what follows an item of an object or a list: `,` and another item
// (a trailing comma is refused), or the closing byte (done).
func (p *jsonParser) afterItem(closing byte, what string) (bool, error) {
	p.skipSpace()
	if p.pos >= len(p.text) {
		return false, p.fail("EOF while parsing " + what)
	}
	switch p.text[p.pos] {
	case ',':
		p.pos++
		p.skipSpace()
		if p.pos < len(p.text) && p.text[p.pos] == closing {
			return false, p.fail("trailing comma")
		}
		return false, nil
	case closing:
		p.pos++
		return true, nil
	default:
		return false, p.fail(fmt.Sprintf("expected `,` or `%c`", closing))
	}
}

func hexValue(c byte) (rune, bool) {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0'), true
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10, true
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10, true
	}
	return 0, false
}

// hex4 reads the four hexadecimal digits of a `\u` escape.
func (p *jsonParser) hex4() (rune, error) {
	var r rune
	for i := 0; i < 4; i++ {
		if p.pos >= len(p.text) {
			return 0, p.fail("EOF while parsing a string")
		}
		d, ok := hexValue(p.text[p.pos])
		if !ok {
			return 0, p.fail("invalid escape")
		}
		r = r<<4 | d
		p.pos++
	}
	return r, nil
}

// str reads a string (the opening quote is at p.pos); a lone surrogate is a fault in
// document order, read as U+FFFD.
func (p *jsonParser) str() (string, error) {
	p.pos++ // '"'
	var b strings.Builder
	for {
		if p.pos >= len(p.text) {
			return "", p.fail("EOF while parsing a string")
		}
		c := p.text[p.pos]
		switch {
		case c == '"':
			p.pos++
			return b.String(), nil
		case c < 0x20:
			return "", p.fail("control character (\\u0000-\\u001F) found while parsing a string")
		case c == '\\':
			p.pos++
			if p.pos >= len(p.text) {
				return "", p.fail("EOF while parsing a string")
			}
			e := p.text[p.pos]
			p.pos++
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, err := p.hex4()
				if err != nil {
					return "", err
				}
				if r >= 0xD800 && r <= 0xDBFF && strings.HasPrefix(p.text[p.pos:], "\\u") {
					save := p.pos
					p.pos += 2
					low, err := p.hex4()
					if err != nil {
						return "", err
					}
					if low >= 0xDC00 && low <= 0xDFFF {
						r = 0x10000 + (r-0xD800)<<10 + (low - 0xDC00)
					} else {
						// Not a pair: the leading surrogate is lone; read the next
						// escape on its own.
						p.pos = save
					}
				}
				if r >= 0xD800 && r <= 0xDFFF {
					p.note("malformed JSON: lone surrogate in hex escape")
					r = utf8.RuneError
				}
				b.WriteRune(r)
			default:
				p.pos--
				return "", p.fail("invalid escape")
			}
		default:
			b.WriteByte(c)
			p.pos++
		}
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *jsonParser) number() (*jsonValue, error) {
	start := p.pos
	if p.text[p.pos] == '-' {
		p.pos++
	}
	if p.pos >= len(p.text) {
		return nil, p.fail("EOF while parsing a value")
	}
	if !isDigit(p.text[p.pos]) {
		return nil, p.fail("invalid number")
	}
	if p.text[p.pos] == '0' {
		p.pos++
		if p.pos < len(p.text) && isDigit(p.text[p.pos]) {
			return nil, p.fail("invalid number")
		}
	} else {
		for p.pos < len(p.text) && isDigit(p.text[p.pos]) {
			p.pos++
		}
	}
	integer := true
	if p.pos < len(p.text) && p.text[p.pos] == '.' {
		integer = false
		p.pos++
		if p.pos >= len(p.text) {
			return nil, p.fail("EOF while parsing a value")
		}
		if !isDigit(p.text[p.pos]) {
			return nil, p.fail("invalid number")
		}
		for p.pos < len(p.text) && isDigit(p.text[p.pos]) {
			p.pos++
		}
	}
	if p.pos < len(p.text) && (p.text[p.pos] == 'e' || p.text[p.pos] == 'E') {
		integer = false
		p.pos++
		if p.pos < len(p.text) && (p.text[p.pos] == '+' || p.text[p.pos] == '-') {
			p.pos++
		}
		if p.pos >= len(p.text) {
			return nil, p.fail("EOF while parsing a value")
		}
		if !isDigit(p.text[p.pos]) {
			return nil, p.fail("invalid number")
		}
		for p.pos < len(p.text) && isDigit(p.text[p.pos]) {
			p.pos++
		}
	}
	text := p.text[start:p.pos]
	if integer {
		if strings.HasPrefix(text, "-") {
			// serde_json: `-0` and anything below i64::MIN are f64s, not integers.
			if n, err := strconv.ParseInt(text, 10, 64); err == nil && n != 0 {
				return &jsonValue{kind: jsonInt, i: n}, nil
			}
		} else if n, err := strconv.ParseUint(text, 10, 64); err == nil {
			return &jsonValue{kind: jsonUint, u: n}, nil
		}
	}
	f, _ := strconv.ParseFloat(text, 64)
	if math.IsInf(f, 0) {
		p.note("malformed JSON: number out of range")
	}
	return &jsonValue{kind: jsonFloat, f: f}, nil
}

// ---------------------------------------------------------------------------------------
// Output: compact JSON text as serde_json writes it (members in insertion order, UTF-8,
// only `"`, `\` and control characters escaped).

// jsonQuote is `s` as a JSON string.
func jsonQuote(s string) string {
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xF])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// jsonMember is one member of an output object: its value is JSON text already.
type jsonMember struct {
	key   string
	value string
}

// jsonObjectText is the compact JSON text of an object of `members`, in their order.
func jsonObjectText(members ...jsonMember) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(jsonQuote(m.key))
		b.WriteByte(':')
		b.WriteString(m.value)
	}
	b.WriteByte('}')
	return b.String()
}

// ---------------------------------------------------------------------------------------
// The schema check (impl/src/plugin/sdk/schema.rs `check_arguments`): the arguments are
// an object; every `required` property is present; with `additionalProperties: false`
// no other is; each property's `type`, `minimum`/`maximum` and `maxLength` hold.

// schemaRule is what one property's schema says.
type schemaRule struct {
	kind      string
	minimum   *float64
	maximum   *float64
	maxLength *int
	enum      []string
}

// schema is a tool's input schema: an object with `required`, `additionalProperties:
// false` and `properties`, in the Rust fixture's key order.
type schema struct {
	required []string
	names    []string
	rules    []schemaRule
}

func (s schema) rule(name string) (schemaRule, bool) {
	for i, n := range s.names {
		if n == name {
			return s.rules[i], true
		}
	}
	return schemaRule{}, false
}

// formatFloat is Rust's `format!("{x}")` of an f64 (never an exponent).
func formatFloat(x float64) string {
	return strconv.FormatFloat(x, 'f', -1, 64)
}

// ruleText is the JSON text of one property's rule (keys in the Rust fixture's order).
func (r schemaRule) text() string {
	members := []jsonMember{{"type", jsonQuote(r.kind)}}
	if r.minimum != nil {
		members = append(members, jsonMember{"minimum", formatFloat(*r.minimum)})
	}
	if r.maximum != nil {
		members = append(members, jsonMember{"maximum", formatFloat(*r.maximum)})
	}
	if r.maxLength != nil {
		members = append(members, jsonMember{"maxLength", strconv.Itoa(*r.maxLength)})
	}
	if r.enum != nil {
		quoted := make([]string, len(r.enum))
		for i, e := range r.enum {
			quoted[i] = jsonQuote(e)
		}
		members = append(members, jsonMember{"enum", "[" + strings.Join(quoted, ",") + "]"})
	}
	return jsonObjectText(members...)
}

// text is the schema's JSON text, byte for byte the Rust fixture's `input_schema_json`.
func (s schema) text() string {
	required := make([]string, len(s.required))
	for i, r := range s.required {
		required[i] = jsonQuote(r)
	}
	properties := make([]jsonMember, len(s.names))
	for i, n := range s.names {
		properties[i] = jsonMember{n, s.rules[i].text()}
	}
	return jsonObjectText(
		jsonMember{"type", `"object"`},
		jsonMember{"required", "[" + strings.Join(required, ",") + "]"},
		jsonMember{"additionalProperties", "false"},
		jsonMember{"properties", jsonObjectText(properties...)},
	)
}

func typeMatches(kind string, v *jsonValue) bool {
	switch kind {
	case "string":
		return v.kind == jsonString
	case "integer":
		return v.kind == jsonInt || v.kind == jsonUint
	case "number":
		return v.kind == jsonInt || v.kind == jsonUint || v.kind == jsonFloat
	case "boolean":
		return v.kind == jsonBool
	case "object":
		return v.kind == jsonObject
	case "array":
		return v.kind == jsonArray
	case "null":
		return v.kind == jsonNull
	}
	return true
}

// checkArguments is "" or the first rule `args` breaks, naming the property.
func checkArguments(s schema, args *jsonValue) string {
	if args.kind != jsonObject {
		return "the arguments must be a JSON object"
	}
	for _, name := range s.required {
		if args.member(name) == nil {
			return fmt.Sprintf("missing required property `%s`", name)
		}
	}
	for _, key := range args.keys {
		if _, ok := s.rule(key); !ok {
			return fmt.Sprintf("unknown property `%s`", key)
		}
	}
	for i, name := range args.keys {
		value := args.vals[i]
		rule, ok := s.rule(name)
		if !ok {
			continue
		}
		if !typeMatches(rule.kind, value) {
			return fmt.Sprintf("property `%s` must be of type %s", name, rule.kind)
		}
		if n, ok := value.asFloat(); ok {
			if rule.minimum != nil && n < *rule.minimum {
				return fmt.Sprintf("property `%s` is below its minimum %s", name, formatFloat(*rule.minimum))
			}
			if rule.maximum != nil && n > *rule.maximum {
				return fmt.Sprintf("property `%s` is above its maximum %s", name, formatFloat(*rule.maximum))
			}
		}
		if value.kind == jsonString && rule.maxLength != nil && utf8.RuneCountInString(value.str) > *rule.maxLength {
			return fmt.Sprintf("property `%s` is longer than %d characters", name, *rule.maxLength)
		}
	}
	return ""
}
