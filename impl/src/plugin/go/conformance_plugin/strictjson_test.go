package main

import (
	"strings"
	"testing"
)

func TestStrictJSONRefusesWhatTheRustSDKRefuses(t *testing.T) {
	for _, text := range []string{
		`{"text":"a","text":"b"}`,
		`{"count":NaN}`,
		`{"count":Infinity}`,
		`{"text":"a"`,
		`{"text":null}`,
		`{"text":"\ud800"}`,
		`{"text":"\udc00\ud800"}`,
		`{"n":1e400}`,
		`{"n":01}`,
		`{"n":1.}`,
		`{"a":1,}`,
		`[1,]`,
		`{"text":"x"} x`,
		"{\"text\":\"\x01\"}",
		``,
		strings.Repeat("[", 128) + strings.Repeat("]", 128),
	} {
		if v, err := parseStrict(text); err == nil {
			t.Errorf("%q parsed as %+v", text, v)
		}
	}
}

func TestStrictJSONReadsNumbersAsSerdeJSONDoes(t *testing.T) {
	for text, kind := range map[string]jsonKind{
		`7`:                    jsonUint,
		`-7`:                   jsonInt,
		`-0`:                   jsonFloat,
		`7.0`:                  jsonFloat,
		`7e0`:                  jsonFloat,
		`18446744073709551615`: jsonUint,
		`18446744073709551616`: jsonFloat,
		`-9223372036854775808`: jsonInt,
		`-9223372036854775809`: jsonFloat,
		`1e-400`:               jsonFloat,
		`"\ud83d\ude00"`:       jsonString,
		strings.Repeat("[", 127) + strings.Repeat("]", 127): jsonArray,
	} {
		v, err := parseStrict(text)
		if err != nil || v.kind != kind {
			t.Errorf("%q: %+v, %v; want kind %d", text, v, err, kind)
		}
	}
	if v, _ := parseStrict(`"\ud83d\ude00\u00e9\n"`); v.str != "😀é\n" {
		t.Errorf("escapes read as %q", v.str)
	}
}

func TestASyntaxErrorIsReportedBeforeAnEarlierFault(t *testing.T) {
	_, err := parseStrict(`{"a":null,"b":}`)
	if err == nil || !strings.HasPrefix(err.Error(), "malformed JSON: ") {
		t.Errorf("got %v", err)
	}
	_, err = parseStrict(`{"a":null,"a":1}`)
	if err == nil || err.Error() != "null value at $.a" {
		t.Errorf("got %v", err)
	}
}

func TestSchemasAreTheRustFixturesText(t *testing.T) {
	want := map[string]string{
		"echo":     `{"type":"object","required":["text"],"additionalProperties":false,"properties":{"text":{"type":"string"}}}`,
		"progress": `{"type":"object","required":["count"],"additionalProperties":false,"properties":{"count":{"type":"integer","minimum":0,"maximum":1000}}}`,
		"slow":     `{"type":"object","required":[],"additionalProperties":false,"properties":{}}`,
		"mutate":   `{"type":"object","required":["key","outcome"],"additionalProperties":false,"properties":{"key":{"type":"string","maxLength":64},"outcome":{"type":"string","enum":["applied","uncertain"]}}}`,
		"output":   `{"type":"object","required":["bytes"],"additionalProperties":false,"properties":{"bytes":{"type":"integer","minimum":0,"maximum":1048576}}}`,
	}
	for name, text := range want {
		if got := findTool(name).schemaText; got != text {
			t.Errorf("%s: %s", name, got)
		}
	}
}

func TestArgumentsAreCheckedAgainstTheSchema(t *testing.T) {
	progress := findTool("progress").schema
	for text, problem := range map[string]string{
		`{"count":3}`:          "",
		`{"count":1000}`:       "",
		`{"count":1001}`:       "property `count` is above its maximum 1000",
		`{"count":-1}`:         "property `count` is below its minimum 0",
		`{"count":1.5}`:        "property `count` must be of type integer",
		`{}`:                   "missing required property `count`",
		`{"count":1,"more":1}`: "unknown property `more`",
		`["count"]`:            "the arguments must be a JSON object",
	} {
		args, err := parseStrict(text)
		if err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		if got := checkArguments(progress, args); got != problem {
			t.Errorf("%s: %q, want %q", text, got, problem)
		}
	}
	mutate := findTool("mutate").schema
	key, _ := parseStrict(`{"key":"` + strings.Repeat("é", 65) + `","outcome":"applied"}`)
	if got := checkArguments(mutate, key); got != "property `key` is longer than 64 characters" {
		t.Errorf("got %q", got)
	}
}

func TestOutputIsCompactJSONAsSerdeWritesIt(t *testing.T) {
	got := jsonObjectText(jsonMember{"text", jsonQuote("a\"\\\n\x01é<>\u2028")})
	if want := `{"text":"a\"\\\n\u0001é<>` + "\u2028" + `"}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	out, _ := runOutput(&call{arguments: mustParse(t, `{"bytes":5}`)})
	if out != `{"data":"xxxxx"}` || len(out) != 5+11 {
		t.Errorf("output: %s", out)
	}
}

func TestCallIdentifiersAndClipping(t *testing.T) {
	if checkCallID("call_id", strings.Repeat("c", 128)) != "" || checkCallID("call_id", "a.b:c-d_E9") != "" {
		t.Error("a valid call ID was refused")
	}
	for _, id := range []string{"", strings.Repeat("c", 129), "a/b", "é"} {
		if checkCallID("call_id", id) == "" {
			t.Errorf("%q was accepted", id)
		}
	}
	if clip("héllo", 2) != "h" || clip("héllo", 3) != "hé" || clip("abc", 10) != "abc" {
		t.Error("clip cuts a character")
	}
}

func TestProofsMatchTheLaunchContractsVectors(t *testing.T) {
	secret := "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
	if got := secretProof(secret, strings.Repeat("ff", 32)); got != "f8d80f50d119bdcf5fb02c69adc704a07483c9705d9ae226e6dd20e00abe6aa5" {
		t.Errorf("secret proof %s", got)
	}
	if got := hostProof(secret); got != "563509441343f50738011e0b8d259e8c522e2a64715421af760232cc99da0b88" {
		t.Errorf("host proof %s", got)
	}
	for value, want := range map[string]string{"Bearer k": "k", "bearer   k": "k", "BEARER k": "k", "Basic k": "", "Bearerk": "", "Bearer ": ""} {
		if got, _ := bearerCredential(value); got != want {
			t.Errorf("%q: %q", value, got)
		}
	}
}

func mustParse(t *testing.T, text string) *jsonValue {
	t.Helper()
	v, err := parseStrict(text)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
