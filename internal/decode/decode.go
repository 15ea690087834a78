// Package decode reads a request body the one way every door reads it, so
// that an HTTP request and a message carrying the same intent are refused
// or accepted alike: strict JSON, and a 400 that names the field.
package decode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/orderservice/orderservice/internal/problem"
)

// MaxBody bounds every request body; 100 items fit many times over. It is
// also NATS's default max_payload, so a message can never carry more.
const MaxBody = 1 << 20

// TooLarge is the answer to a body larger than MaxBody, through either
// door: a message may carry more when its broker's max_payload is raised.
func TooLarge() error {
	return problem.Errorf(problem.PayloadTooLarge, "The request body is larger than %d bytes.", MaxBody)
}

// JSON reads body into v, strictly: one JSON value, member names
// matched exactly, no duplicate members (a gateway that reads the first
// value and a service that reads the last must never disagree), no unknown
// members (server-owned fields such as id, status or tenant_id are refused,
// never silently taken). An empty body leaves v at its zero value; the use
// case then names the first missing field.
//
// No request member may be null (null is no value where the document says
// integer, string or object) or hold NUL in a string (PostgreSQL refuses
// it in text, and the document promises text); invalid UTF-8 and lone
// surrogates are refused by the decoder itself. A request type may refuse
// a missing member with MissingField.
func JSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v, json.RejectUnknownMembers(true)); err != nil {
		return jsonError(err)
	}
	return nullsAndNULs(body)
}

// nullsAndNULs refuses the first null value or string holding NUL in a
// body that is valid JSON.
func nullsAndNULs(body []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return nil // the end (Unmarshal has read it all before)
		}
		switch tok.Kind() {
		case 'n':
			return InvalidBody(fieldPath(dec.StackPointer()), "must not be null")
		case '"':
			if strings.ContainsRune(tok.String(), 0) {
				return InvalidBody(fieldPath(dec.StackPointer()), "must not contain NUL")
			}
		}
	}
}

// MissingField is the error a request type's decoder returns for a
// required member that is absent, which its zero value cannot tell apart.
type MissingField string

func (m MissingField) Error() string { return string(m) + " is required" }

// jsonError names the member a decoding error is about, as a field path
// such as items[0].quantity.
func jsonError(err error) error {
	var syntax *jsontext.SyntacticError
	var semantic *json.SemanticError
	var missing MissingField
	switch {
	case errors.As(err, &semantic) && errors.As(err, &missing):
		return InvalidBody(join(fieldPath(semantic.JSONPointer), string(missing)), "is required")
	case errors.As(err, &syntax) && errors.Is(syntax.Err, jsontext.ErrDuplicateName):
		return InvalidBody(fieldPath(syntax.JSONPointer), "appears more than once")
	case errors.As(err, &syntax):
		return InvalidBody("body", fmt.Sprintf("is not valid JSON (at byte %d)", syntax.ByteOffset))
	case errors.As(err, &semantic) && errors.Is(semantic.Err, json.ErrUnknownName):
		return InvalidBody(fieldPath(semantic.JSONPointer), "is not a field of this request")
	case errors.As(err, &semantic):
		field := fieldPath(semantic.JSONPointer)
		if semantic.GoType != nil {
			return InvalidBody(field, "must be a JSON "+jsonType(semantic.GoType.Kind().String()))
		}
		return InvalidBody(field, "has the wrong type")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return InvalidBody("body", "is truncated JSON")
	}
	return InvalidBody("body", "is not a valid request")
}

// join names member of the object at path.
func join(path, member string) string {
	if path == "body" {
		return member
	}
	return path + "." + member
}

// fieldPath turns a JSON Pointer (/items/0/quantity) into items[0].quantity.
func fieldPath(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if _, err := strconv.Atoi(tok); err == nil && b.Len() > 0 {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	if b.Len() == 0 {
		return "body"
	}
	return b.String()
}

func jsonType(kind string) string {
	switch kind {
	case "int", "int64", "int32":
		return "integer in range"
	case "map", "struct":
		return "object"
	case "slice":
		return "array"
	}
	return kind
}

// maxField bounds the field a problem names (api/openapi.yaml, Problem): an
// unknown member's name comes from the client and may be as long as the body.
const maxField = 200

// InvalidBody is the 400 that names the field a body is wrong about.
func InvalidBody(field, why string) error {
	if r := []rune(field); len(r) > maxField {
		field = string(r[:maxField-1]) + "…"
	}
	return problem.Errorf(problem.InvalidRequest, "%s: %s", field, why).With("field", field)
}
