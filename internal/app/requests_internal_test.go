package app

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Once closed, the requests still arriving are refused as every 503 of the
// service is (problem+json, Retry-After) and never reach the handler; the
// ones being served are what close hands back to wait on.
func TestRequestsAfterCloseAreRefusedAndTheServedOnesAwaited(t *testing.T) {
	var rs requests
	served, release := make(chan struct{}), make(chan struct{})
	h := rs.track(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(served)
			<-release
		}
	}))
	done := make(chan struct{})
	go func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/slow", nil)); close(done) }()
	<-served

	wg := rs.close()
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	late := httptest.NewRecorder()
	h.ServeHTTP(late, httptest.NewRequest("GET", "/late", nil))
	if late.Code != http.StatusServiceUnavailable || late.Header().Get("Retry-After") != "1" ||
		!strings.HasPrefix(late.Header().Get("Content-Type"), "application/problem+json") ||
		!strings.Contains(late.Body.String(), `"code":"service_unavailable"`) {
		t.Errorf("a request after close = %d %q %s, want 503 problem+json with Retry-After", late.Code, late.Header(), late.Body)
	}
	select {
	case <-waited:
		t.Fatal("the wait ended while a request was still being served")
	default:
	}
	close(release)
	<-done
	<-waited
}
