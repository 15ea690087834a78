package client

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Defaults of RetryPolicy: its zero fields take these values.
const (
	// DefaultMaxAttempts is how many requests a call sends at most.
	DefaultMaxAttempts = 8
	// DefaultBaseDelay is the backoff ceiling before the second attempt.
	DefaultBaseDelay = 100 * time.Millisecond
	// DefaultMaxDelay caps the backoff ceiling.
	DefaultMaxDelay = 5 * time.Second
)

// RetryPolicy bounds the retries of one call. Zero fields take the defaults.
type RetryPolicy struct {
	// MaxAttempts counts every request of a call, the first included
	// (default 8; 1 disables retries).
	MaxAttempts int
	// BaseDelay is the backoff ceiling before the second attempt; it
	// doubles per attempt (default 100ms).
	BaseDelay time.Duration
	// MaxDelay caps the backoff ceiling (default 5s). A longer Retry-After
	// from the server is still honoured.
	MaxDelay time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.MaxDelay < p.BaseDelay {
		p.MaxDelay = p.BaseDelay
	}
	return p
}

// ceiling is the capped exponential bound of the wait after the given
// failed attempt (1-based): BaseDelay·2^(attempt-1), at most MaxDelay.
func (p RetryPolicy) ceiling(attempt int) time.Duration {
	d := p.BaseDelay
	for i := 1; i < attempt; i++ {
		if d >= p.MaxDelay/2 {
			return p.MaxDelay
		}
		d *= 2
	}
	return min(d, p.MaxDelay)
}

// backoff is the wait after the given failed attempt: full jitter, a
// uniform draw from [0, ceiling], so that many clients failing together do
// not retry together; never less than the server's Retry-After.
func (p RetryPolicy) backoff(attempt int, retryAfter time.Duration, jitter func(time.Duration) time.Duration) time.Duration {
	return max(jitter(p.ceiling(attempt)), retryAfter)
}

// fullJitter draws uniformly from [0, ceiling].
func fullJitter(ceiling time.Duration) time.Duration {
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling + 1)
}

// sleepCtx waits d, or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryableStatus reports whether an answer with this status and problem
// code leaves the intent open, so that the same key may be sent again.
func retryableStatus(status int, code string) bool {
	switch status {
	case http.StatusConflict:
		return code == CodeInProgress // invalid_transition is final
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP date;
// zero when absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// rateLimitWait reads the RateLimit fields (draft-ietf-httpapi-ratelimit-headers:
// a list of items `"policy";r=N;t=S`) and returns the longest t of a
// policy with nothing left (r=0): when the service expects to take a
// request again. Zero when none is empty or says when; an item that does
// not parse is ignored, as the draft asks.
func rateLimitWait(fields []string) time.Duration {
	var longest int64
	for _, field := range fields {
		for item := range strings.SplitSeq(field, ",") {
			params := strings.Split(strings.TrimSpace(item), ";")
			if len(params) < 2 || !strings.HasPrefix(params[0], `"`) {
				continue
			}
			remaining, reset := int64(-1), int64(0)
			for _, p := range params[1:] {
				name, value, _ := strings.Cut(strings.TrimSpace(p), "=")
				n, err := strconv.ParseInt(value, 10, 64)
				if err != nil || n < 0 {
					continue
				}
				switch name {
				case "r":
					remaining = n
				case "t":
					reset = n
				}
			}
			if remaining == 0 {
				longest = max(longest, min(reset, int64(24*time.Hour/time.Second)))
			}
		}
	}
	return time.Duration(longest) * time.Second
}
