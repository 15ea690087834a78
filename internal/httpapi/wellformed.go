package httpapi

import (
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// wellFormed rejects, before anything reads it, a request whose query
// string is not valid percent-encoding (a client's `limit=%zz` must not be
// read as no limit at all), or whose path or query holds text that is not
// UTF-8 or holds NUL. api/openapi.yaml promises UTF-8 text, PostgreSQL
// would fail on those bytes, and a failure there would read as an outage.
// Every query parameter name and value, and the path as routed, is checked
// here once, so that no handler sees such text.
func wellFormed(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		query, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return invalidQuery("query", "is not valid percent-encoding")
		}
		for name, values := range query {
			if !isText(name) {
				return invalidQuery("query", "a parameter name is not UTF-8 text without NUL")
			}
			for _, v := range values {
				if !isText(v) {
					return invalidQuery(name, "must be UTF-8 text without NUL")
				}
			}
		}
		if !isText(r.URL.Path) {
			return invalidQuery("path", "must be UTF-8 text without NUL")
		}
		for i, v := range c.ParamValues() {
			if !isText(v) {
				return invalidQuery(c.ParamNames()[i], "must be UTF-8 text without NUL")
			}
		}
		return next(c)
	}
}

// isText reports whether s is valid UTF-8 without NUL (nor a surrogate,
// which valid UTF-8 cannot hold).
func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }
