package httpapi

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/decode"
)

// maxBody bounds every request body; 100 items fit many times over.
const maxBody = decode.MaxBody

// readBody reads a JSON body into v with the decoder every door shares
// (decode.JSON: strict, one value, no unknown or repeated
// members), after the HTTP-only checks: at most maxBody bytes, and a JSON
// media type when there is a body.
func readBody(c echo.Context, v any) error {
	r := c.Request()
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return echo.ErrStatusRequestEntityTooLarge
	}
	if err != nil {
		return decode.InvalidBody("body", "could not be read")
	}
	if len(strings.TrimSpace(string(body))) > 0 && !isJSON(r.Header.Get(echo.HeaderContentType)) {
		return echo.ErrUnsupportedMediaType
	}
	return decode.JSON(body, v)
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
