package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/problem"
)

// maxBody bounds every request body; 100 items fit many times over.
const maxBody = 1 << 20

// decode reads a JSON body into v, strictly: one JSON value, no unknown
// fields (server-owned fields such as id, status or tenant_id are refused,
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
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return invalidBody("body", "must hold exactly one JSON object")
	}
	return nil
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// jsonError names the field a decoding error is about.
func jsonError(err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return invalidBody("body", fmt.Sprintf("is not valid JSON (at byte %d)", syntax.Offset))
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return invalidBody(field, "must be a JSON "+jsonType(typ.Type.Kind().String()))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return invalidBody(field, "is not a field of this request")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidBody("body", "is truncated JSON")
	}
	return invalidBody("body", "is not a valid request")
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

func invalidBody(field, why string) error {
	return problem.Errorf(problem.InvalidRequest, "%s: %s", field, why).With("field", field)
}
