package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/rs/cors"
)

// CORS lets pages from other origins call /v1. A browser sends a preflight
// before a request carrying Authorization, Idempotency-Key or Prefer; the
// answer names the exact origins allowed (never "*": the API is
// authenticated) and the headers a page may read, so a script can see that
// a response was a replay, where the order is, when to retry, and what is
// left of its tenant's quotas.
var (
	corsAllowedHeaders = []string{"Authorization", "Content-Type", "Idempotency-Key", "Prefer"}
	corsExposedHeaders = []string{"Idempotent-Replayed", "Location", "Retry-After", "Preference-Applied", "RateLimit-Policy", "RateLimit"}
)

// WithCORS wraps h so that /v1 answers preflights and cross-origin requests
// from origins; with none, h is returned unchanged (CORS off). It goes
// outside admission control, so a shed request's 503 and Retry-After are
// readable by the page too.
func WithCORS(h http.Handler, origins []string) http.Handler {
	if len(origins) == 0 {
		return h
	}
	c := cors.New(cors.Options{
		AllowedOrigins: origins,
		AllowedMethods: []string{http.MethodGet, http.MethodHead, http.MethodPost},
		AllowedHeaders: corsAllowedHeaders,
		ExposedHeaders: corsExposedHeaders,
		MaxAge:         600,
	}).Handler(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if underV1(r.URL.Path) {
			c.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// CheckOrigin reports whether o is an exact origin a browser sends:
// scheme://host[:port], http or https, lower case, nothing else.
func CheckOrigin(o string) error {
	u, err := url.Parse(o)
	switch {
	case err != nil:
		return fmt.Errorf("origin %q: %v", o, err)
	case strings.Contains(o, "*"):
		return fmt.Errorf("origin %q: wildcards are not allowed, name each origin", o)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("origin %q: the scheme must be http or https", o)
	case u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return fmt.Errorf("origin %q: an origin is scheme://host[:port], nothing more", o)
	case o != strings.ToLower(o):
		return fmt.Errorf("origin %q: write it in lower case, as browsers send it", o)
	}
	return nil
}
