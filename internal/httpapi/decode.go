package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/problem"
)

// maxBody bounds every request body; 100 items fit many times over.
const maxBody = 1 << 20

// decode reads a JSON body into v, strictly: one JSON value, member names
// matched exactly, no duplicate members (a gateway that reads the first
// value and a service that reads the last must never disagree), no unknown
// members (server-owned fields such as id, status or tenant_id are refused,
// never silently taken), at most maxBody bytes. An empty body leaves v at
// its zero value; the use case then names the first missing field.
func decode(c echo.Context, v any) error {
	r := c.Request()
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return echo.ErrStatusRequestEntityTooLarge
	}
	if err != nil {
		return invalidBody("body", "could not be read")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if !isJSON(r.Header.Get(echo.HeaderContentType)) {
		return echo.ErrUnsupportedMediaType
	}
	if err := json.Unmarshal(body, v, json.RejectUnknownMembers(true)); err != nil {
		return jsonError(err)
	}
	return nil
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// jsonError names the member a decoding error is about, as a field path
// such as items[0].quantity.
func jsonError(err error) error {
	var syntax *jsontext.SyntacticError
	var semantic *json.SemanticError
	switch {
	case errors.As(err, &syntax) && errors.Is(syntax.Err, jsontext.ErrDuplicateName):
		return invalidBody(fieldPath(syntax.JSONPointer), "appears more than once")
	case errors.As(err, &syntax):
		return invalidBody("body", fmt.Sprintf("is not valid JSON (at byte %d)", syntax.ByteOffset))
	case errors.As(err, &semantic) && errors.Is(semantic.Err, json.ErrUnknownName):
		return invalidBody(fieldPath(semantic.JSONPointer), "is not a field of this request")
	case errors.As(err, &semantic):
		field := fieldPath(semantic.JSONPointer)
		if semantic.GoType != nil {
			return invalidBody(field, "must be a JSON "+jsonType(semantic.GoType.Kind().String()))
		}
		return invalidBody(field, "has the wrong type")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidBody("body", "is truncated JSON")
	}
	return invalidBody("body", "is not a valid request")
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

func invalidBody(field, why string) error {
	if r := []rune(field); len(r) > maxField {
		field = string(r[:maxField-1]) + "…"
	}
	return problem.Errorf(problem.InvalidRequest, "%s: %s", field, why).With("field", field)
}
